#include "model/spec.h"

namespace m3 {

int ModelSpec::num_sparse_layers() const {
  int n = 0;
  for (auto k : attn) n += k == AttnKind::Sparse;
  return n;
}

}  // namespace m3
