// What the CPU reference needs of a ModelSpec and ModelWeights before it runs: every field it
// relies on and every tensor's shape, checked with errors that name the field or tensor. (The
// config parser and weight loader check too; this also guards specs and weights built by hand,
// e.g. in tests or from dequantized GPU weights.)
#pragma once
#include "model/spec.h"
#include "model/weights.h"

namespace m3::ref {

void check_ref_spec(const ModelSpec& spec);
// tp: w is one rank's shard of tp (model/tp_shard.h; spec the rank's): lm_head has vocab / tp rows.
void check_ref_weights(const ModelSpec& spec, const ModelWeights& w, int tp = 1);

}  // namespace m3::ref
