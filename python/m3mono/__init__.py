"""m3mono: MiniMax-M3 inference from Python.

Offline generation, mirroring vLLM's offline API::

    import m3mono
    m3mono.make_tiny("/tmp/tiny")                      # a synthetic checkpoint (released layout)
    llm = m3mono.LLM("/tmp/tiny", device="cpu")        # "cuda", or "auto": CUDA when a GPU is visible
    out = llm.generate([[1, 2, 3], "Hello"], m3mono.SamplingParams(max_tokens=8))
    print(out[0].token_ids, out[1].text)

Prompts are lists of token ids, or strings when the checkpoint has a tokenizer.json. Errors from
the engine arrive as m3mono.Error (a ValueError) with the engine's message.

The library level (a host framework that loaded the weights itself lends them; issue 16, first
part)::

    lay = m3mono.Layout("/tmp/tiny", tp_rank=0, tp_size=1)   # the prepared arena's tensors by name
    lay.layer_tensors(3)            # [{"name": "qkv.codes", "dtype": "F8_E4M3", "storage": "uint8", "shape": (...)}, ...]
    arrays = m3mono.prepared_arrays(lay)["layers"][3]       # or the framework's own buffers (DLPack)
    spec = m3mono.LayerSpec(lay, 3, arrays)                 # checked and borrowed, never copied

A tensor of another element type, shape, strides, alignment or device is refused (m3mono.Error
naming the layer and the tensor) instead of converted; the spec keeps its arrays alive. The layers
over such specs and the caller's fp32 paged caches (the CPU reference today)::

    model = m3mono.LayerSpec(lay, -1, arrays_of_the_model)   # embedding, lm_head, final norm
    caches = m3mono.CacheSpec(lay, num_blocks, [{"k": .., "v": .., "ik": ..} per layer])  # fp32, borrowed
    nl = m3mono.NativeLayers(lay, model, layer_specs, caches)
    nl.prepare_step([(start_pos, tokens, block_table)])
    x = nl.embed()
    nl.forward_layers(0, lay.num_layers, x)                 # x: the residual stream, in place
    logits = nl.logits(x)

On a GPU the same calls take CUDA tensors (device="cuda" on the specs and the CacheSpec; uint8 or
float8_e4m3fn caches), write into the caller's arrays (`embed(out=x)`, `logits(x, out)`) and run on
the caller's stream (`stream=torch.cuda.current_stream().cuda_stream`), so they capture into a
CUDA graph; a graph captured over one decode step replays later steps of the same shape after
their prepare_step. `m3mono.Mono(lay, model, layer_specs, caches)` is the fused decode path over
the same borrowed specs (the same bits as NativeLayers): it runs decode steps of at most 4
sequences of 1 to 4 query tokens each and refuses anything else, or a format it cannot run, with
the reason (m3mono.Error); run each step shape once eagerly before capturing it. close() releases
either object (idempotent; a closed object raises).

Tensor parallelism: `g = m3mono.TPGroup(2)`; rank r builds its own Layout(dir, tp_rank=r, tp_size=2),
specs and caches and `NativeLayers(..., tp=g.rank(r))`, and runs the same calls on its own thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from ._m3mono import (CacheSpec, Engine, Error, LayerSpec, Layout, Mono, NativeLayers, TPContext, TPGroup, info,
                      make_tiny, prepared_arrays)

__all__ = ["LLM", "SamplingParams", "RequestOutput", "Error", "make_tiny", "info", "Layout", "LayerSpec",
           "CacheSpec", "NativeLayers", "Mono", "TPGroup", "TPContext", "prepared_arrays"]


@dataclass
class SamplingParams:
    """How new tokens are drawn: temperature 0 is greedy (lowest id wins ties); top_k 0 and top_p 1
    are off; the same seed gives the same tokens (draw i of a request uses (seed, i))."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop_at_eos: bool = False


@dataclass
class RequestOutput:
    prompt_token_ids: List[int]
    token_ids: List[int]
    text: Optional[str] = None  # when the checkpoint has a tokenizer


class LLM:
    """A model loaded once; generate() runs prompts one after another on it.

    device: "auto" (CUDA when this build has it and a GPU is visible, else the CPU reference),
    "cpu" or "cuda"; tp: tensor-parallel ranks (threads of this process: CPU reference ranks, or
    GPU ranks on GPU r mod the visible GPUs); tp_comm: the GPU ranks' collectives ("auto", "nccl",
    "host"); mono: the fused decode path on CUDA; max_model_len: the longest prompt + new tokens
    (default: 4096, at most the model's max_position_embeddings); speculative: "none", "ngram" or
    "eagle3" (with draft_model, an EAGLE3 draft checkpoint directory, run where draft_device says:
    "auto" (the target's device), "cpu" or "cuda"), num_draft_tokens drafts per verify step (1..3):
    greedy outputs are those of plain decoding; speculative_stats counts the
    last generate's verify steps and drafts.
    """

    def __init__(self, model: str, device: str = "auto", tp: int = 1, mono: bool = False, threads: int = 0,
                 max_model_len: int = 0, tp_comm: str = "auto", speculative: str = "none",
                 draft_model: Optional[str] = None, num_draft_tokens: int = 3, draft_device: str = "auto"):
        self._engine = Engine(str(model), device, tp, mono, threads, max_model_len, tp_comm, speculative,
                              str(draft_model) if draft_model is not None else "", num_draft_tokens, draft_device)

    @property
    def speculative_stats(self) -> dict:
        """verify_steps, drafted and accepted of the last prompt generate() ran."""
        return dict(self._engine.speculative_stats)

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def encode(self, text: str) -> List[int]:
        return list(self._engine.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._engine.decode([int(i) for i in ids])

    def generate(self, prompts: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]],
                 sampling_params: Optional[SamplingParams] = None) -> List[RequestOutput]:
        sp = sampling_params or SamplingParams()
        if isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        outs = []
        for p in prompts:
            if isinstance(p, str):
                ids = self.encode(p)
            else:
                ids = [int(i) for i in p]
                if not all(isinstance(i, int) for i in p):
                    raise TypeError("a prompt is a string or a list of token ids")
            new = list(self._engine.generate(ids, int(sp.max_tokens), float(sp.temperature), int(sp.top_k),
                                             float(sp.top_p), int(sp.seed), bool(sp.stop_at_eos)))
            text = self._engine.decode(new) if self._engine.has_tokenizer else None
            outs.append(RequestOutput(prompt_token_ids=ids, token_ids=new, text=text))
        return outs
