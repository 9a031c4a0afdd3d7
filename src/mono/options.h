// Mono options from text: "key=value/key=value" (the bench's path variants, e.g.
// `--paths mono,mono:reserve=4/small=8`). Keys: poll_ns, pin (0/1), reserve, small, stage (mask:
// 1 projections, 2 experts, 4 the O projection), smem_min, smem_cap, ring (0/1/2), early (0/1),
// stream (0/1), fp8_whole (0/1), fence (0/1), grid, serialized (0/1), watchdog_ms (mono/mono.h,
// mono/task_table.h).
// An unknown key or a bad value is an error naming it.
#pragma once
#include <string>

#include "mono/mono.h"

namespace m3::mono {

MonoOptions parse_options(const std::string& text, MonoOptions base = {});

}  // namespace m3::mono
