// Device MXFP4 (or, fp8, MXFP8) expert tensors for the MoE GPU tests (test_moe.cpp,
// test_moe_mma.cpp): one projection, all slots, in the prepared layout (codes [slots][rows][ld],
// E8M0 scales [slots][rows][sld]), its native view, and the host dequantization of one slot (exact:
// the values the device multiplies).
#pragma once
#include <cstdint>
#include <vector>

#include "model/quantize.h"
#include "native/moe.h"
#include "test_gemv_util.h"

namespace m3::test {

struct DeviceExperts {
  int slots = 0, rows = 0, cols = 0;
  int64_t ld = 0, sld = 0;
  bool fp8 = false;  // MXFP8: E4M3 codes, rows of round_up(cols, 32) bytes
  DevBuf<uint8_t> codes, scales;

  // Allocates (contents unset: upload or fill_random next).
  void alloc(int s, int r, int c, bool mxfp8 = false) {
    slots = s;
    rows = r;
    cols = c;
    fp8 = mxfp8;
    ld = fp8 ? (c + 31) / 32 * 32 : mxfp4_row_bytes(c);
    sld = mxfp4_row_blocks(c);
    codes = DevBuf<uint8_t>(size_t(s) * r * ld);
    scales = DevBuf<uint8_t>(size_t(s) * r * sld);
  }
  // Random codes (padding included; finite E4M3 codes for MXFP8) and E8M0 scales in [slo, shi],
  // filled on the device.
  void fill_random(uint64_t seed, int slo, int shi) {
    fill_random_device(codes.p, codes.n, seed, fp8 ? FillKind::Fp8NoNan : FillKind::Bytes);
    fill_random_device(scales.p, scales.n, seed + 1, FillKind::E8M0Range, slo, shi);
  }
  native::Mxfp4Experts view() const {
    native::Mxfp4Experts e;
    e.codes = codes.p;
    e.scales = scales.p;
    e.ld = ld;
    e.sld = sld;
    e.slot_codes = int64_t(rows) * ld;
    e.slot_scales = int64_t(rows) * sld;
    e.slots = slots;
    e.rows = rows;
    e.cols = cols;
    e.fp8 = fp8;
    return e;
  }
  // Slot `slot` dequantized on the host: fp32 [rows][cols].
  std::vector<float> dequant(int slot) const {
    std::vector<uint8_t> c(size_t(rows) * ld), s(size_t(rows) * sld);
    M3_CUDA_CHECK(cudaMemcpy(c.data(), codes.p + size_t(slot) * rows * ld, c.size(), cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(s.data(), scales.p + size_t(slot) * rows * sld, s.size(), cudaMemcpyDeviceToHost));
    std::vector<float> m(size_t(rows) * cols);
    pool().parallel_for(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        (fp8 ? dequantize_mxfp8_row : dequantize_mxfp4_row)(c.data() + r * ld, s.data() + r * sld, cols,
                                                            m.data() + r * cols);
    });
    return m;
  }
};

}  // namespace m3::test
