// Gemma RMS norm with the fused residual add on the GPU (native/norm.h) against ref::gemma_rms_norm
// (double) on the same inputs: hidden 6144 and odd widths, with and without a residual, in place
// (residual_out aliasing the residual), fp32 and bf16 outputs. Outputs poisoned first.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "native/norm.h"
#include "ref/norm.h"
#include "norm_halves_host.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

// Random inputs of one case on host and device: x and residual rows [M][ld] (x ~ N(0, 9), residual
// ~ N(0, 1)), the bf16 weight w (~ N(0, 0.04)) and its values wf.
struct NormInputs {
  std::vector<float> x, res, wf;
  std::vector<uint16_t> w;
  DevBuf<float> dx, dr;
  DevBuf<uint16_t> dw;
};
NormInputs norm_inputs(std::mt19937& rng, int n, int M, int64_t ld) {
  std::normal_distribution<float> nd;
  NormInputs in;
  in.x.resize(size_t(M) * ld);
  in.res.resize(in.x.size());
  for (auto& v : in.x) v = nd(rng) * 3.f;
  for (auto& v : in.res) v = nd(rng);
  in.w.resize(size_t(n));
  in.wf.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    in.w[size_t(i)] = f32_to_bf16(nd(rng) * 0.2f);
    in.wf[size_t(i)] = bf16_to_f32(in.w[size_t(i)]);
  }
  in.dx = DevBuf<float>(in.x.size());
  in.dr = DevBuf<float>(in.res.size());
  in.dw = DevBuf<uint16_t>(in.w.size());
  in.dx.upload(in.x);
  in.dr.upload(in.res);
  M3_CUDA_CHECK(cudaMemcpy(in.dw.p, in.w.data(), in.w.size() * 2, cudaMemcpyHostToDevice));
  return in;
}

}  // namespace

TEST(GpuNorm, RmsNormWithResidual) {
  const uint32_t seed = gpu_test_seed() + 21;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int n, M;
  };
  for (const C& c : {C{6144, 1}, C{6144, 5}, C{6144, 64}, C{333, 7}, C{128, 3}, C{1, 2}}) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: no residual, 1: residual -> residual_out, 2: in place
      const int64_t ld = c.n + 4;
      NormInputs in = norm_inputs(rng, c.n, c.M, ld);
      const std::vector<float>&x = in.x, &res = in.res, &wf = in.wf;
      DevBuf<float>&dx = in.dx, &dr = in.dr;
      DevBuf<uint16_t>& dw = in.dw;
      DevBuf<float> dro(res.size()), dy(x.size());
      DevBuf<uint16_t> dyb(x.size());
      dy.poison();
      dro.poison();
      M3_CUDA_CHECK(cudaMemset(dyb.p, 0xff, dyb.n * 2));
      kernels::RmsNormParams a;
      a.x = dx.p;
      a.ld_x = ld;
      if (mode > 0) {
        a.residual = dr.p;
        a.ld_res = ld;
        a.residual_out = mode == 2 ? dr.p : dro.p;
        a.ld_res_out = ld;
      }
      a.w = dw.p;
      a.y = dy.p;
      a.ld_y = ld;
      a.y_bf16 = dyb.p;
      a.ld_yb = ld;
      a.n = c.n;
      a.M = c.M;
      a.eps = 1e-6f;
      native::rms_norm(a, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> ref(size_t(c.M) * c.n), rsum(ref.size());
      for (int t = 0; t < c.M; ++t) {
        for (int i = 0; i < c.n; ++i)
          rsum[size_t(t) * c.n + i] = x[size_t(t) * ld + i] + (mode > 0 ? res[size_t(t) * ld + i] : 0.f);
        ref::gemma_rms_norm(&rsum[size_t(t) * c.n], wf.data(), c.n, 1e-6f, &ref[size_t(t) * c.n]);
      }
      const std::string what = "rmsnorm n=" + std::to_string(c.n) + " M=" + std::to_string(c.M) + " mode " +
                               std::to_string(mode);
      // fp32 sum of squares: per-thread chains of n/256 terms + an 8-way tree; the relative error
      // of 1/rms is about half of that of the sum, and the output adds a few roundings
      const double rtol = (double(c.n) / 256 + 24) * 0x1p-24;
      expect_close_rows(dy.download(), ld, ref, c.M, c.n, 1e-30, rtol, what + " fp32");
      auto yb = dyb.download();
      std::vector<float> ybf(yb.size());
      for (size_t i = 0; i < yb.size(); ++i) ybf[i] = bf16_to_f32(yb[i]);
      // bf16 output: the rounding of a value within rtol of the reference: one bf16 ulp (2^-8 rel)
      expect_close_rows(ybf, ld, ref, c.M, c.n, 1e-30, 0x1p-8, what + " bf16");
      if (mode > 0) {
        auto ro = (mode == 2 ? dr : dro).download();
        // the same fp32 addition on both sides: equal bits (atol 1e-30 only avoids 0/0 in the ratio)
        expect_close_rows(ro, ld, rsum, c.M, c.n, 1e-30, 0, what + " residual out (exact)");
      }
    }
  }
}

// The prep half of the norm (kernels/fused_norm_params.h): z = r (1 + w) and the residual out bit
// for bit as the host computes them, inv bit for bit the host's chunk tree and lane order, and
// z * inv within the plain norm's bound of the double reference. Both bodies: the row in registers
// (16-byte aligned rows) and the strided one (odd row strides). Outputs poisoned first.
TEST(GpuNorm, PrepHalfMatchesTheHostBitForBit) {
  const uint32_t seed = gpu_test_seed() + 22;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int n, M;
    int pad = 4;  // ld = n + pad: 4 keeps rows 16-byte aligned (register body), 1 does not (strided)
  };
  for (const C& c : {C{6144, 1}, C{6144, 4}, C{6144, 9}, C{2048, 3}, C{6144, 2, 1}, C{160, 5, 1}, C{8192, 2, 4}}) {
    for (int mode = 0; mode < 2; ++mode) {  // 0: x alone (layer 0), 1: x = f + residual, in place
      const int64_t ld = c.n + c.pad;
      NormInputs in = norm_inputs(rng, c.n, c.M, ld);
      const std::vector<float>&x = in.x, &res = in.res, &wf = in.wf;
      const std::vector<uint16_t>& w = in.w;
      DevBuf<float>&dx = in.dx, &dr = in.dr;
      DevBuf<uint16_t>& dw = in.dw;
      DevBuf<float> dy(x.size()), dinv(static_cast<size_t>(c.M));
      dy.poison();
      dinv.poison();
      kernels::RmsNormParams a;
      a.x = dx.p;
      a.ld_x = ld;
      if (mode == 1) {
        a.residual = dr.p;
        a.ld_res = ld;
        a.residual_out = dr.p;
        a.ld_res_out = ld;
      }
      a.w = dw.p;
      a.y = dy.p;
      a.ld_y = ld;
      a.n = c.n;
      a.M = c.M;
      a.eps = 1e-6f;
      a.prep = 1;
      a.inv = dinv.p;
      const kernels::RmsNormParams made = native::make_rmsnorm_params(a);
      EXPECT_EQ(made.regs, c.pad == 1 ? 0 : 1) << "the body this case is for";
      native::rms_norm(a, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      const auto z = dy.download(), inv = dinv.download(), ro = dr.download();
      const std::string what = "prep n=" + std::to_string(c.n) + " M=" + std::to_string(c.M) + " ld=" +
                               std::to_string(ld) + " mode " + std::to_string(mode);
      std::vector<float> r(size_t(c.n)), zref(size_t(c.M) * c.n), yref(size_t(c.M) * c.n), zinv(yref.size());
      int bad = 0;
      for (int t = 0; t < c.M; ++t) {
        for (int i = 0; i < c.n; ++i) {
          const size_t at = size_t(t) * ld + i;
          r[size_t(i)] = mode == 1 ? x[at] + res[at] : x[at];
          zref[size_t(t) * c.n + i] = norm_z_host(r[size_t(i)], w[size_t(i)]);
          if (mode == 1 && std::memcmp(&ro[at], &r[size_t(i)], 4) != 0 && bad++ < 3)
            ADD_FAILURE() << what << ": residual out [" << t << "][" << i << "] " << ro[at] << " != " << r[size_t(i)];
        }
        const float want = norm_inv_from_chunks(norm_chunk_sums(r.data(), c.n), c.n, 1e-6f);
        EXPECT_EQ(std::memcmp(&inv[size_t(t)], &want, 4), 0)
            << what << ": inv of row " << t << " " << inv[size_t(t)] << " != host " << want;
        ref::gemma_rms_norm(r.data(), wf.data(), c.n, 1e-6f, &yref[size_t(t) * c.n]);
        for (int i = 0; i < c.n; ++i) zinv[size_t(t) * c.n + i] = z[size_t(t) * ld + i] * inv[size_t(t)];
      }
      // z: the same two fp32 operations on both sides: equal bits (atol 1e-30 only avoids 0/0)
      expect_close_rows(z, ld, zref, c.M, c.n, 1e-30, 0, what + " z (exact)");
      // z * inv vs the double norm: the plain norm's bound (chunk sums of 16 in a tree, n / 512
      // lane terms, a 32-way tree: fewer roundings than the plain body's chains) plus z's and the
      // product's roundings
      const double rtol = (double(c.n) / 256 + 26) * 0x1p-24;
      expect_close_rows(zinv, c.n, yref, c.M, c.n, 1e-30, rtol, what + " z * inv");
    }
  }
}
