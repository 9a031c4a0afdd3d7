// `m3mono bench --eagle3-draft`: the EAGLE3 draft network on the GPU (native/eagle3_net.h) at a
// MiniMax-M3-sized draft shape with random weights: the wall time a decode step adds for its drafts.
#pragma once
#include "bench/report.h"
#include "model/spec.h"

namespace m3::bench {

// Times observe(1 row) and draft(1 row) (each synchronizes: host gathers, uploads, the kernels, the
// logits read back) and adds a note with their medians to r.
void bench_eagle3_draft(const ModelSpec& target, uint64_t seed, BenchReport& r);

}  // namespace m3::bench
