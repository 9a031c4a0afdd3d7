// The prepared arena as named tensors (model/prepared_tensors.h).
#include "model/prepared_tensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "core/weight_tiles.h"

namespace m3 {

namespace {

const char* elem_name(DType d, int elem_bytes) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16 (or uint16)";
    default: return elem_bytes == 1 ? "uint8" : "?";
  }
}

void add(std::vector<TensorSpec>& out, const std::string& name, const PTensor& t) {
  if (t.empty()) return;
  TensorSpec s;
  s.name = name;
  s.dtype = t.dtype;
  s.elem_bytes = t.dtype == DType::F32 ? 4 : t.dtype == DType::BF16 ? 2 : 1;
  M3_CHECK(t.row_bytes % s.elem_bytes == 0, "prepared tensor {}: {} bytes a row", name, t.row_bytes);
  const int64_t rows = t.tiled ? tiled_rows(t.rows) : t.rows;
  if (t.slots > 1) s.shape.push_back(t.slots);
  if (rows > 1 || t.slots > 1) s.shape.push_back(rows);
  s.shape.push_back(t.row_bytes / s.elem_bytes);
  s.offset = t.offset;
  s.bytes = t.bytes;
  out.push_back(std::move(s));
}

}  // namespace

std::string TensorSpec::describe() const {
  return fmt::format("{}: {} as {} [{}]", name, dtype_name(dtype), elem_name(dtype, elem_bytes), fmt::join(shape, ", "));
}

std::vector<TensorSpec> layer_tensor_specs(const PreparedLayout& L, int layer) {
  M3_CHECK(layer >= 0 && size_t(layer) < L.layers.size(), "prepared tensors: layer {} of {}", layer, L.layers.size());
  const PreparedLayerLayout& Y = L.layers[size_t(layer)];
  std::vector<TensorSpec> v;
  add(v, "input_norm", Y.input_norm);
  add(v, "post_norm", Y.post_norm);
  add(v, "q_norm", Y.q_norm);
  add(v, "k_norm", Y.k_norm);
  add(v, "iq_norm", Y.iq_norm);
  add(v, "ik_norm", Y.ik_norm);
  add(v, "qkv.codes", Y.qkv.codes);
  add(v, "qkv.scales", Y.qkv.scales);
  add(v, "o.codes", Y.o.codes);
  add(v, "o.scales", Y.o.scales);
  add(v, "dense_gate_up", Y.dense_gate_up);
  add(v, "dense_down", Y.dense_down);
  add(v, "router", Y.router);
  add(v, "router_bias", Y.router_bias);
  add(v, "w13.codes", Y.w13.codes);
  add(v, "w13.scales", Y.w13.scales);
  add(v, "w2.codes", Y.w2.codes);
  add(v, "w2.scales", Y.w2.scales);
  add(v, "shared_w13.codes", Y.shared_w13.codes);
  add(v, "shared_w13.scales", Y.shared_w13.scales);
  add(v, "shared_w2.codes", Y.shared_w2.codes);
  add(v, "shared_w2.scales", Y.shared_w2.scales);
  return v;
}

std::vector<TensorSpec> model_tensor_specs(const PreparedLayout& L) {
  std::vector<TensorSpec> v;
  add(v, "embed", L.embed);
  add(v, "lm_head", L.lm_head);
  add(v, "final_norm", L.final_norm);
  return v;
}

std::string check_borrowed(const TensorSpec& s, const BorrowedTensor& t, bool want_cpu) {
  const std::string shape = fmt::format("[{}]", fmt::join(t.shape, ", "));
  if (!t.data) return fmt::format("{}: no data (a null or empty buffer)", s.name);
  bool type_ok = false;
  const int bits = 8 * s.elem_bytes;
  switch (s.dtype) {
    case DType::F32: type_ok = t.kind == ElemKind::Float && t.bits == 32; break;
    case DType::BF16: type_ok = (t.kind == ElemKind::BFloat || t.kind == ElemKind::UInt) && t.bits == 16; break;
    case DType::F8_E4M3: type_ok = (t.kind == ElemKind::UInt || t.kind == ElemKind::Float8E4M3) && t.bits == 8; break;
    default: type_ok = t.kind == ElemKind::UInt && t.bits == bits; break;
  }
  static const char* kinds[] = {"uint", "int", "float", "bfloat", "float8_e4m3fn"};
  if (!type_ok)
    return fmt::format("{}: element type {}{} where the arena stores {} (as {}): refused, not converted", s.name,
                       kinds[int(t.kind)], t.kind == ElemKind::Float8E4M3 ? "" : std::to_string(t.bits),
                       dtype_name(s.dtype), elem_name(s.dtype, s.elem_bytes));
  if (t.shape != s.shape)
    return fmt::format("{}: shape {} where the arena's layout is [{}] ({})", s.name, shape, fmt::join(s.shape, ", "),
                       s.describe());
  if (!t.strides.empty()) {
    int64_t want = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
      if (t.shape[i] != 1 && t.strides[i] != want)
        return fmt::format("{}: strides [{}] (elements) are not compact row-major for shape {}: refused, not copied",
                           s.name, fmt::join(t.strides, ", "), shape);
      want *= t.shape[i];
    }
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return fmt::format("{}: data at {} is not 16-byte aligned (the kernels load 16 bytes at a time)", s.name, t.data);
  if (want_cpu && !t.on_cpu) return fmt::format("{}: a device buffer where the CPU reference needs host memory", s.name);
  if (!want_cpu && t.on_cpu) return fmt::format("{}: host memory where the GPU path needs a device buffer", s.name);
  return "";
}

}  // namespace m3
