// A read-only look at each layer's FFN input, for probes (m3mono router-probe): ffn_block calls the
// tap with y = N(x; post_attention_layernorm), [n_tok, hidden] rows in batch order, of layer
// `layer` (dense and MoE alike; on MoE layers this is exactly the router's input), before the FFN
// runs. The pointer is valid only during the call.
#pragma once
#include <functional>

namespace m3::ref {

using FfnInputTap = std::function<void(int layer, const float* y, int n_tok)>;

}  // namespace m3::ref
