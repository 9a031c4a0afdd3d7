// Scaled dot-product attention of one query head over an explicit list of cached keys:
//   out = sum_j softmax_j(scale * q . K[j]) V[j]
// with one plain softmax over the listed keys. Full attention lists every key j <= p; MSA lists
// the keys j <= p inside the selected blocks. Scores, softmax and the weighted sum are in double.
#pragma once
#include <cstdint>

namespace m3::ref {

// q: [dim]. Key/value j live at k + slots[j] * stride and v + slots[j] * stride (k and v already
// offset to the head's channels). n >= 1 keys. out: [dim].
void attend_head(const float* q, const float* k, const float* v, int64_t stride, const int64_t* slots, int n,
                 int dim, double scale, float* out);

}  // namespace m3::ref
