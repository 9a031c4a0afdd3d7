// Per-kernel benches against plain cold reads and cuBLASLt (kernel_bench.h).
#include "bench/cuda/kernel_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "bench/bench_case.h"
#include "bench/cuda/device_weights.h"
#include "bench/cuda/graph_timer.h"
#include "bench/cuda/lt_matmul.h"
#include "bench/cuda/probes.h"
#include "core/weight_tiles.h"
#include "model/synthetic.h"
#include "native/cuda_check.h"
#include "native/linear.h"
#include "native/moe.h"
#include "native/weight_tiles.h"

namespace m3::bench {

double rotation_us(int n, const std::function<void(int, cudaStream_t)>& fn, int warmup, int reps, cudaStream_t s) {
  GraphTiming t = time_graph(
      [&](cudaStream_t st) {
        for (int i = 0; i < n; ++i) fn(i, st);
      },
      s, warmup, reps);
  return t.us.median / n;
}

namespace {

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { M3_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

size_t l2_bytes() {
  int dev = 0, l2 = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  M3_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  return size_t(l2);
}

// Copies so one rotation reads at least 4 x L2 (and at least 3 copies).
int copies_for(double bytes) { return std::max(3, int(std::ceil(4.0 * double(l2_bytes()) / bytes))); }

}  // namespace

std::vector<KernelResult> bench_fp8_gemv(const KernelBenchOptions& o, cudaStream_t s) {
  std::vector<KernelResult> out;
  const ModelSpec real = synthetic_preset("real");
  for (int tp : o.tps) {
    const PreparedLayout L = plan_prepared(last_layers(shard_spec(real, tp), 1));
    const auto& Y = L.layers[0];
    struct Shape {
      const char* what;
      const PFp8* m;
    };
    for (Shape sh : {Shape{"qkv", &Y.qkv}, Shape{"o", &Y.o}}) {
      const int N = int(sh.m->codes.rows), K = int(sh.m->codes.cols);
      const int64_t ld = sh.m->codes.row_bytes;
      M3_CHECK(ld % kTileBlockBytes == 0 && N % kTileRows == 0, "bench: {} [{} x {}] is not whole tiles", sh.what, N, ld);
      const size_t cb = size_t(N) * size_t(ld), sb = size_t(N) * 4, one = (cb + sb + 255) / 256 * 256;
      const int nb = copies_for(double(one));
      // each copy twice: row-major (w) and tiled (wt, the prepared arena's layout), the same codes
      DevMem w(one * size_t(nb)), wt(one * size_t(nb));
      for (int i = 0; i < nb; ++i) {
        uint8_t* p = w.as<uint8_t>() + size_t(i) * one;
        fill_random(p, N, ld, K, FillFormat::Fp8, 0, 0, o.seed + 17 * i, s);
        const float sc = 1.0f / (448.0f * std::sqrt(float(K)));
        fill_random(p + cb, 1, int64_t(sb), int64_t(sb), FillFormat::F32, 0.5f * sc, 1.5f * sc, o.seed + 17 * i + 1, s);
        uint8_t* pt = wt.as<uint8_t>() + size_t(i) * one;
        native::tile_fp8(p, N, ld, pt, s);
        M3_CUDA_CHECK(cudaMemcpyAsync(pt + cb, p + cb, sb, cudaMemcpyDeviceToDevice, s));
      }
      SegmentReader rd;
      std::vector<int> lists;
      for (int i = 0; i < nb; ++i) {
        const uint8_t* p = w.as<uint8_t>() + size_t(i) * one;
        lists.push_back(rd.add({ReadSeg{p, cb}, ReadSeg{p + cb, sb}}));
      }
      const double read_us = rotation_us(nb, [&](int i, cudaStream_t st) { rd.read(lists[size_t(i)], st); }, o.warmup,
                                         o.reps, s);
      const int maxM = *std::max_element(o.Ms.begin(), o.Ms.end());
      DevMem x(size_t(maxM) * size_t(ld) * 4), y(size_t(maxM) * size_t(N) * 4);
      fill_random(x.p, 1, int64_t(maxM) * ld * 4, int64_t(maxM) * ld * 4, FillFormat::F32, -2, 2, o.seed + 5, s);
      // x as its producer would hand it over split into bf16 hi / lo (kernels/act_split.cuh; random
      // halves: the time does not depend on the values)
      DevMem xsplit(size_t(maxM) * size_t(ld) * 4);
      fill_random(xsplit.p, 1, int64_t(maxM) * ld * 4, int64_t(maxM) * ld * 4, FillFormat::Bf16, -2, 2, o.seed + 8, s);
      DevMem x8(size_t(maxM) * size_t(ld)), xs(size_t(maxM) * 4);
      fill_random(x8.p, 1, int64_t(maxM) * ld, int64_t(maxM) * ld, FillFormat::Fp8, 0, 0, o.seed + 6, s);
      fill_random(xs.p, 1, int64_t(maxM) * 4, int64_t(maxM) * 4, FillFormat::F32, 0.5f, 1.5f, o.seed + 7, s);
      for (int M : o.Ms) {
        M3_CHECK(M >= 1 && M <= maxM, "bench: gemv M {} outside [1, {}]", M, maxM);
        auto view = [&](int i, bool tiled) {
          const uint8_t* p = (tiled ? wt : w).as<uint8_t>() + size_t(i) * one;
          return native::Fp8Weight{p, reinterpret_cast<const float*>(p + cb), N, K, ld, tiled};
        };
        // the tensor-core kernel (the native path for every M) and the CUDA-core GEMV (up to 16)
        KernelResult k;
        k.shape = fmt::format("{}x{} tp{} {} x f32", N, K, tp, sh.what);
        k.M = M;
        k.bytes = double(cb + sb);
        k.read_us = read_us;
        k.flops = 2.0 * M * N * K;
        k.cublas_us = NAN;
        if (o.cublas) {
          try {
            Fp8Matmul mm(N, K, M, ld, ld);
            DevMem yb(size_t(M) * size_t(N) * 2);
            auto lt = [&](int i, cudaStream_t st) {
              const uint8_t* p = w.as<uint8_t>() + size_t(i) * one;
              mm.run(p, mm.outer_vec() ? reinterpret_cast<const float*>(p + cb) : reinterpret_cast<const float*>(p + cb),
                     x8.as<uint8_t>(), xs.as<float>(), yb.as<uint16_t>(), st);
            };
            lt(0, s);
            M3_CUDA_CHECK(cudaStreamSynchronize(s));
            k.cublas_us = rotation_us(nb, lt, o.warmup, o.reps, s);
            k.cublas_note = mm.note();
          } catch (const Error& e) {
            k.cublas_note = std::string("cuBLASLt FP8 not run: ") + e.what();
            cudaGetLastError();
          }
        }
        // fp8_mma: the tiled arena layout; fp8_mma_rows: the same codes row-major; fp8_gemv: row-major;
        // fp8_mma_split: the tiled layout over x split by its producer (the plans' qkv and O decode
        // tiles, native::use_split_activations; M <= 8 and M3_SPLIT_ACT not 0)
        for (int variant = 0; variant < 4; ++variant) {
          const native::LinearPath path = variant == 2 ? native::LinearPath::Gemv : native::LinearPath::Auto;
          const bool tiled = variant == 0 || variant == 3;
          if (path == native::LinearPath::Gemv && M > native::kGemvMaxM) continue;
          const native::ActIn xin{x.p, DType::F32, ld};
          if (variant == 3) {
            kernels::MmaLinearParams p = native::make_fp8_linear_params(view(0, true), xin, M, y.as<float>(), N);
            if (!native::use_split_activations(p, xsplit.p)) continue;
          }
          auto run = [&](int i, cudaStream_t st) {
            if (variant == 3) {
              kernels::MmaLinearParams p = native::make_fp8_linear_params(view(i, true), xin, M, y.as<float>(), N);
              native::use_split_activations(p, xsplit.p);
              native::launch(p, st);
            } else {
              native::linear_fp8(view(i, tiled), xin, M, y.as<float>(), N, st, path);
            }
          };
          run(0, s);  // eager first (module load, checks)
          M3_CUDA_CHECK(cudaStreamSynchronize(s));
          k.kernel = variant == 0 ? "fp8_mma" : variant == 1 ? "fp8_mma_rows" : variant == 2 ? "fp8_gemv" : "fp8_mma_split";
          k.us = rotation_us(nb, run, o.warmup, o.reps, s);
          out.push_back(k);
        }
      }
    }
  }
  return out;
}

std::vector<KernelResult> bench_moe(const KernelBenchOptions& o, cudaStream_t s) {
  constexpr int kLayers = 4;
  std::vector<KernelResult> out;
  const ModelSpec real = synthetic_preset("real");
  for (int tp : o.tps) {
    // four MoE layers; entry i of the rotation uses layer i % 4 and its own tokens, so consecutive
    // launches route to different experts of different layers (cold reads)
    const ModelSpec spec = last_layers(shard_spec(real, tp), kLayers);
    PrepareOptions po;
    DeviceArena arena(plan_prepared(spec, po), o.seed + uint64_t(tp), s);
    const int H = spec.hidden, nx = 8;
    const auto& Ls = arena.layout();
    for (int M : o.Ms) {
      DevMem x(size_t(nx) * M * H * 4), y(size_t(M) * H * 4);
      fill_random(x.p, 1, int64_t(nx) * M * H * 4, int64_t(nx) * M * H * 4, FillFormat::F32, -2, 2,
                  o.seed + 100 + uint64_t(M), s);
      std::vector<native::MoeWeights> wl;
      for (int l = 0; l < kLayers; ++l) wl.push_back(arena.moe(l));
      const size_t wsb = native::moe_workspace_bytes(wl[0], M);
      std::vector<std::unique_ptr<DevMem>> ws;
      for (int i = 0; i < nx; ++i) ws.push_back(std::make_unique<DevMem>(wsb));
      auto run = [&](int i, cudaStream_t st) {
        const native::MoeWeights& w = wl[size_t(i % kLayers)];
        native::moe_forward(w, x.as<float>() + size_t(i) * M * H, H, M, y.as<float>(), H, ws[size_t(i)]->p, wsb, st);
      };
      // eager pass: routing of every entry, read back for the byte count and the plain-read lists
      // (the whole layer's, and per stage: router, gate_up = w13, down = w2)
      SegmentReader rd;
      std::vector<int> lists, router_lists, up_lists, down_lists;
      double bytes = 0, router_bytes = 0, up_bytes = 0, down_bytes = 0;
      for (int i = 0; i < nx; ++i) {
        run(i, s);
        M3_CUDA_CHECK(cudaStreamSynchronize(s));
        const native::MoeWeights& w = wl[size_t(i % kLayers)];
        std::vector<int32_t> ids(size_t(M) * size_t(w.K));
        M3_CUDA_CHECK(cudaMemcpy(ids.data(), native::moe_workspace(w, M, ws[size_t(i)]->p).ids, ids.size() * 4,
                                 cudaMemcpyDeviceToHost));
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        for (int32_t e : ids) M3_CHECK(e >= 0 && e < w.E, "bench moe: routed to expert {} of {}", e, w.E);
        const auto& Y = Ls.layers[size_t(i % kLayers)];
        std::vector<ReadSeg> segs{{arena.base() + Y.router.offset, Y.router.bytes},
                                  {arena.base() + Y.router_bias.offset, Y.router_bias.bytes}};
        std::vector<ReadSeg> up, down;
        std::vector<int> slots(ids.begin(), ids.end());
        if (Y.shared_in_slot) slots.push_back(spec.num_experts);
        for (int e : slots) {
          for (const PTensor* t : {&Y.w13.codes, &Y.w13.scales})
            up.push_back({arena.base() + t->offset + uint64_t(e) * t->slot_bytes(), t->slot_bytes()});
          for (const PTensor* t : {&Y.w2.codes, &Y.w2.scales})
            down.push_back({arena.base() + t->offset + uint64_t(e) * t->slot_bytes(), t->slot_bytes()});
        }
        for (const PTensor* t : {&Y.shared_w13.codes, &Y.shared_w13.scales})
          if (!t->empty()) up.push_back({arena.base() + t->offset, t->bytes});
        for (const PTensor* t : {&Y.shared_w2.codes, &Y.shared_w2.scales})
          if (!t->empty()) down.push_back({arena.base() + t->offset, t->bytes});
        router_lists.push_back(rd.add(segs));
        router_bytes += double(rd.bytes(router_lists.back()));
        up_lists.push_back(rd.add(up));
        up_bytes += double(rd.bytes(up_lists.back()));
        down_lists.push_back(rd.add(down));
        down_bytes += double(rd.bytes(down_lists.back()));
        segs.insert(segs.end(), up.begin(), up.end());
        segs.insert(segs.end(), down.begin(), down.end());
        lists.push_back(rd.add(segs));
        bytes += double(rd.bytes(lists.back()));
      }
      KernelResult k;
      k.kernel = "moe_mxfp4";
      k.shape = fmt::format("E{} I{} H{} tp{}", spec.num_experts, spec.moe_inter, H, tp);
      k.M = M;
      k.bytes = bytes / nx;
      k.us = rotation_us(nx, run, o.warmup, o.reps, s);
      k.read_us = rotation_us(nx, [&](int i, cudaStream_t st) { rd.read(lists[size_t(i)], st); }, o.warmup, o.reps, s);
      k.cublas_us = NAN;
      const auto& Y = Ls.layers[0];
      k.flops = 2.0 * M * (spec.top_k + 1) *
                (double(Y.w13.codes.rows) * double(Y.w13.codes.cols) + double(Y.w2.codes.rows) * double(Y.w2.codes.cols));
      out.push_back(k);
      if (o.moe_stages) {
        // where the layer's time goes: T(n) = the rotation enqueuing only the ops of the first n
        // stages of every MoE layer (the op names of native::add_moe_ops, consecutive equal names one
        // stage), stage n = T(n) - T(n - 1); each stage next to a plain read of its bytes (router, w13,
        // w2 of the experts hit) or, for a stage that reads no weights, next to one empty kernel per
        // launch of the rotation (a launch's floor)
        std::vector<std::vector<native::OpCall>> layer_ops(static_cast<size_t>(nx));
        for (int i = 0; i < nx; ++i)
          native::add_moe_ops(layer_ops[size_t(i)], wl[size_t(i % kLayers)], x.as<float>() + size_t(i) * M * H, H, M,
                              y.as<float>(), H, ws[size_t(i)]->p, wsb);
        std::vector<std::string> names;
        for (const native::OpCall& op : layer_ops[0])
          if (names.empty() || names.back() != op.name) names.push_back(op.name);
        auto prefix = [&](int n) {
          return rotation_us(
              nx,
              [&](int i, cudaStream_t st) {
                int stage = 0;
                const char* prev = nullptr;
                for (const native::OpCall& op : layer_ops[size_t(i)]) {
                  if (prev && std::string(prev) != op.name) ++stage;
                  prev = op.name;
                  if (stage >= n) break;
                  native::launch(op, st);
                }
              },
              o.warmup, o.reps, s);
        };
        const double full = prefix(1 << 30);
        const double empty_us = rotation_us(nx, [](int, cudaStream_t st) { launch_empty(st); }, o.warmup, o.reps, s);
        auto list_read = [&](const std::vector<int>& ls) {
          return rotation_us(nx, [&](int i, cudaStream_t st) { rd.read(ls[size_t(i)], st); }, o.warmup, o.reps, s);
        };
        double prev = 0;
        for (size_t n = 0; n < names.size(); ++n) {
          const double t = n + 1 == names.size() ? full : prefix(int(n) + 1);
          KernelResult st = k;
          st.kernel = "moe:" + names[n];
          st.us = t - prev;
          st.flops = 0;
          prev = t;
          if (names[n] == "router") {
            st.bytes = router_bytes / nx;
            st.read_us = list_read(router_lists);
          } else if (names[n] == "gate_up") {
            st.bytes = up_bytes / nx;
            st.read_us = list_read(up_lists);
          } else if (names[n] == "down") {
            st.bytes = down_bytes / nx;
            st.read_us = list_read(down_lists);
          } else {
            st.bytes = 0;
            st.read_us = empty_us;
            st.shape += " (vs empty kernel)";
          }
          out.push_back(st);
        }
      }
      if (M <= 64 && native::moe_kernel() != native::MoeKernel::Gemv) {  // the CUDA-core kernel as a yardstick
        const native::MoeKernel was = native::moe_kernel();
        native::moe_set_kernel(native::MoeKernel::Gemv);
        k.kernel = "moe_mxfp4_gemv";
        k.us = rotation_us(nx, run, o.warmup, o.reps, s);
        native::moe_set_kernel(was);
        out.push_back(k);
      }
    }
  }
  return out;
}

}  // namespace m3::bench
