"""Make tiny MiniMax-M3 checkpoints with transformers' own implementation, plus golden outputs.

Each fixture: config.json + model.safetensors written by save_pretrained (real checkpoint layout),
and golden.safetensors: per prompt the ids, fp64 prefill logits, greedy continuation, per-step logits,
and the indexer's block selections during prefill.
"""
import json, os, sys, tarfile, torch
from safetensors.torch import save_file
from transformers.models.minimax_m3_vl import (MiniMaxM3VLConfig,)
from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import (
    MiniMaxM3SparseForConditionalGeneration, MiniMaxM3VLIndexer, MiniMaxM3VLRMSNorm, MiniMaxM3VLTopKRouter)

OUT = os.environ.get("OUT", "/tmp/out")

def text_cfg(**kw):
    n = kw.pop("layers"); n_dense = kw.pop("n_dense")
    d = dict(vocab_size=1024, hidden_size=256, intermediate_size=64, shared_intermediate_size=64,
             dense_intermediate_size=256, num_hidden_layers=n, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, rotary_dim=32, num_local_experts=16, num_experts_per_tok=4, routed_scaling_factor=2.0,
             index_n_heads=2, index_head_dim=64, index_block_size=16, index_topk_blocks=4, index_local_blocks=1,
             rms_norm_eps=1e-6, max_position_embeddings=4096, initializer_range=0.06, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2, pad_token_id=None,
             layer_types=["full_attention"] * n_dense + ["minimax_m3_sparse"] * (n - n_dense),
             mlp_layer_types=["dense"] * n_dense + ["sparse"] * (n - n_dense))
    d.update(kw)
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta", 5e6),
                            "partial_rotary_factor": d["rotary_dim"] / d["head_dim"]}
    return d

def build(name, seed, tc, prompts, gen):
    torch.manual_seed(seed)
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
              temporal_patch_size=2, spatial_merge_size=2, image_size=56)
    cfg = MiniMaxM3VLConfig(text_config=tc, vision_config=vc, projector_hidden_size=tc["hidden_size"])
    model = MiniMaxM3SparseForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MiniMaxM3VLRMSNorm):
                m.weight.normal_(0.0, 0.2)
            if isinstance(m, MiniMaxM3VLTopKRouter):
                m.e_score_correction_bias.normal_(0.0, 0.05)
        # checkpoint dtypes like the released model: bf16 everywhere, fp32 router weights and bias
        model.to(torch.bfloat16)
        for m in model.modules():
            if isinstance(m, MiniMaxM3VLTopKRouter):
                m.float()
    d = os.path.join(OUT, name); os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    # golden: reload what was written, compute in float64 on the CPU
    ref = MiniMaxM3SparseForConditionalGeneration.from_pretrained(d, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager").eval()
    sel = {}
    def hook(mod, inp, out):
        sel.setdefault(mod.layer_idx, out.detach().clone())
    golden = {}
    g = torch.Generator().manual_seed(seed + 1)
    for pi, plen in enumerate(prompts):
        ids = torch.randint(3, tc["vocab_size"], (1, plen), generator=g)
        hs = [m.register_forward_hook(hook) for m in ref.modules() if isinstance(m, MiniMaxM3VLIndexer)]
        sel.clear()
        with torch.no_grad():
            logits = ref(input_ids=ids).logits[0]
        for h in hs: h.remove()
        golden[f"p{pi}.ids"] = ids[0].to(torch.int64)
        golden[f"p{pi}.prefill_logits"] = logits.float()
        for li, s in sel.items():
            golden[f"p{pi}.prefill_blocks.layer{li}"] = s[0].to(torch.int32).contiguous()  # [H_idx, S, topk]
        with torch.no_grad():
            o = ref.generate(input_ids=ids, max_new_tokens=gen, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        golden[f"p{pi}.greedy_ids"] = o.sequences[0, plen:].to(torch.int64)
        golden[f"p{pi}.step_logits"] = torch.stack([l[0] for l in o.logits]).float()
        # consistency: one no-cache forward over prompt+continuation must give the same last logits
        with torch.no_grad():
            full = ref(input_ids=o.sequences).logits[0]
        diff = (full[plen - 1:-1] - torch.stack([l[0] for l in o.logits])).abs().max().item()
        print(name, "prompt", pi, "len", plen, "cache-vs-full max diff", diff, "top1 margin min",
              (lambda t: (t[:, 0] - t[:, 1]).min().item())(torch.stack([l[0] for l in o.logits]).topk(2).values))
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(d, "golden.safetensors"),
              metadata={"source": "transformers " + __import__("transformers").__version__ + " float64 eager"})
    keys = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].keys() if os.path.exists(os.path.join(d, "model.safetensors.index.json")) else None
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        print(name, len(names), "tensors")
        for k in names:
            if "vision" in k or "projector" in k: continue
            if ".layers." in k and not any(f".layers.{i}." in k for i in (0, tc["num_hidden_layers"] - 1)): continue
            t = f.get_slice(k)
            print("  ", k, t.get_dtype(), t.get_shape())
    with tarfile.open(os.path.join(OUT, name + ".tar.gz"), "w:gz") as tf:
        tf.add(d, arcname=name)
    import shutil; shutil.rmtree(d)

which = sys.argv[1:] or ["a"]
if "a" in which:
    build("tiny-m3-a", 1234, text_cfg(layers=4, n_dense=1), prompts=[37, 150, 261], gen=32)
if "b" in which:
    # Other shapes: 6 q heads over 3 KV groups, head_dim 32 with a quarter rotary, block 8, top-3 blocks,
    # 2 local blocks, 8 experts top-3, a non-contiguous layer plan (full/sparse attention and dense/MoE
    # MLPs interleaved independently), prompts below, at and far above the 24-token sparse window.
    build("tiny-m3-b", 777, text_cfg(layers=5, n_dense=2, hidden_size=192, num_attention_heads=6,
                                     num_key_value_heads=3, head_dim=32, rotary_dim=8, index_n_heads=3,
                                     index_head_dim=32, index_block_size=8, index_topk_blocks=3,
                                     index_local_blocks=2, num_local_experts=8, num_experts_per_tok=3,
                                     intermediate_size=48, shared_intermediate_size=32,
                                     dense_intermediate_size=160, vocab_size=512, rope_theta=10000.0,
                                     routed_scaling_factor=1.5,
                                     layer_types=["full_attention", "minimax_m3_sparse", "full_attention",
                                                  "minimax_m3_sparse", "minimax_m3_sparse"],
                                     mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"]),
          prompts=[5, 24, 97, 203], gen=24)
if "c" in which:
    # Fallback shape with a contiguous plan (2 full + dense layers first), in case a mixed plan is refused.
    build("tiny-m3-c", 778, text_cfg(layers=5, n_dense=2, hidden_size=192, num_attention_heads=6,
                                     num_key_value_heads=3, head_dim=32, rotary_dim=8, index_n_heads=3,
                                     index_head_dim=32, index_block_size=8, index_topk_blocks=3,
                                     index_local_blocks=2, num_local_experts=8, num_experts_per_tok=3,
                                     intermediate_size=48, shared_intermediate_size=32,
                                     dense_intermediate_size=160, vocab_size=512, rope_theta=10000.0),
          prompts=[5, 24, 97, 203], gen=24)
# More fixtures: add build(...) calls with other text_cfg(...) arguments (layers, n_dense, head counts,
# index_block_size, index_topk_blocks, index_local_blocks, experts, widths, vocab, rope_theta) and
# other prompt lengths; keep each archive small (under 16 MiB).
