"""The library level of the Python module (issue 16), run by tests/scripts/python_module.sh:
- Layout lists every tensor of a layer as the prepared arena stores it (names, storage, shapes),
  per tensor-parallel rank (the rank's shapes: tp 2 halves the heads' rows and the expert widths);
- prepared_arrays hands out the arena filled from the checkpoint as numpy arrays, and LayerSpec
  accepts them for every layer without copying: data_ptr(name) is the array's own buffer, and the
  spec keeps the arrays alive after the caller drops them;
- every kind of wrong tensor is refused with m3mono.Error naming the layer, the tensor and what is
  wrong (element type, shape, strides, alignment, device, a missing or an unknown tensor), never
  converted; a non-array is refused too; nothing kills the interpreter;
- NativeLayers (the CPU reference's layers over those borrowed tensors and over paged fp32 caches the
  test allocates, NaN-poisoned): a Python loop (prepare_step, embed, forward_layer for every layer,
  logits) over a prefill of two sequences and greedy decode steps gives the greedy ids of
  `m3mono generate --device cpu --weights prepared` (the engine on the same dequantized arena), and
  writes the caches in place; wrong cache arrays are refused; close() is idempotent and a closed
  object raises; Mono (the fused GPU decode path) over host specs is refused naming why."""
import gc
import os
import random
import subprocess
import sys

import numpy as np

import m3mono
from checks import check, fails, refused

src, binary = sys.argv[1], sys.argv[2]
model = os.path.join(src, "tests", "data", "tiny-m3-a")
lay = m3mono.Layout(model)
info = m3mono.info(model)
check(lay.num_layers == info["num_layers"], f"Layout has the model's {info['num_layers']} layers")
arrs = m3mono.prepared_arrays(lay)
check(len(arrs["layers"]) == lay.num_layers, "prepared_arrays: one dict per layer")
check(set(arrs["model"]) == {t["name"] for t in lay.model_tensors()}, "prepared_arrays: the model tensors")
np_dtype = {"uint8": np.uint8, "float32": np.float32, "bfloat16": np.uint16}
for l in range(lay.num_layers):
    want = lay.layer_tensors(l)
    got = arrs["layers"][l]
    same = set(got) == {t["name"] for t in want} and all(
        got[t["name"]].shape == tuple(t["shape"]) and got[t["name"]].dtype == np_dtype[t["storage"]] for t in want)
    check(same, f"layer {l}: the arrays have the layout's names, shapes and storage ({len(want)} tensors)")
    spec = m3mono.LayerSpec(lay, l, got)
    ptr_ok = all(spec.data_ptr(n) == got[n].__array_interface__["data"][0] for n in got)
    check(ptr_ok and sorted(spec.names) == sorted(got), f"layer {l}: LayerSpec borrows every array (same pointers)")

# the rank's shapes: tp 2 halves q heads' rows and the expert widths
r0, r1 = m3mono.Layout(model, tp_rank=0, tp_size=2), m3mono.Layout(model, tp_rank=1, tp_size=2)
full = {t["name"]: t["shape"] for t in lay.layer_tensors(1)}
half = {t["name"]: t["shape"] for t in r0.layer_tensors(1)}
check(half["o.codes"][1] * 2 == full["o.codes"][1],
      f"tp 2: the O projection's columns per rank ({half['o.codes']} vs {full['o.codes']})")
check(half["w2.codes"][-1] * 2 == full["w2.codes"][-1], f"tp 2: the down projections' width per rank "
      f"({half['w2.codes']} vs {full['w2.codes']})")
check({t["name"]: t["shape"] for t in r1.layer_tensors(1)} == half, "tp 2: both ranks have the same shapes")
ok, msg = refused(lambda: m3mono.Layout(model, tp_rank=2, tp_size=2), "rank 2 of 2")
check(ok, f"a rank outside the group is refused: {msg}")

# the spec keeps its arrays alive: drop every other reference, then read through the pointer
l = random.randrange(lay.num_layers)
layer = dict(arrs["layers"][l])
name = random.choice(sorted(layer))
before = layer[name].copy()
spec = m3mono.LayerSpec(lay, l, layer)
ptr = spec.data_ptr(name)
del layer, arrs
gc.collect()
view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * before.nbytes).from_address(ptr))
check(np.array_equal(view, before.view(np.uint8).reshape(-1)), f"layer {l} '{name}': alive through the spec only")

# refusals: one wrong tensor at a time, each naming the layer, the tensor and the fault
arrs = m3mono.prepared_arrays(lay)
l = 1
good = arrs["layers"][l]
names = sorted(good)


def with_(name, value):
    d = dict(good)
    d[name] = value
    return d


u8 = next(n for n in names if good[n].dtype == np.uint8 and good[n].ndim == 2)
f32 = next(n for n in names if good[n].dtype == np.float32)
cases = [
    ("element type", with_(u8, good[u8].astype(np.int8)), [u8, "element type int8", "not converted"]),
    ("float for codes", with_(u8, good[u8].astype(np.float32)), [u8, "element type float32"]),
    ("float64 scales", with_(f32, good[f32].astype(np.float64)), [f32, "element type float64"]),
    ("shape", with_(u8, good[u8][:-1]), [u8, "shape"]),
    ("transposed", with_(u8, np.ascontiguousarray(good[u8].T).T), [u8, "strides", "not copied"]),
    ("strided view", with_(u8, np.repeat(good[u8], 2, axis=1)[:, ::2]), [u8, "strides"]),
    ("misaligned", with_(u8, np.frombuffer(np.zeros(good[u8].nbytes + 1, np.uint8).tobytes(), np.uint8,
                                               count=good[u8].nbytes, offset=1).reshape(good[u8].shape)),
     [u8, "16-byte aligned"]),
    ("missing", {k: v for k, v in good.items() if k != u8}, [u8, "missing"]),
    ("unknown", with_("wq_extra", good[u8]), ["wq_extra", "not a tensor of this layer"]),
    ("not an array", with_(u8, "hello"), [u8, "not an array"]),
]
for what, tensors, needles in cases:
    ok, msg = refused(lambda: m3mono.LayerSpec(lay, l, tensors), f"layer {l}", *needles)
    check(ok, f"refused ({what}): {msg}")
ok, msg = refused(lambda: m3mono.LayerSpec(lay, l, good, device="cuda"), "host memory", "device buffer")
check(ok, f"host arrays for the GPU path are refused: {msg}")
ok, msg = refused(lambda: m3mono.LayerSpec(lay, lay.num_layers, good), "layer")
check(ok, f"a layer past the model is refused: {msg}")
check(m3mono.LayerSpec(lay, l, good).layer == l, "the interpreter is still fine after the refusals")

# NativeLayers: a layer loop in Python against the engine
def cli_ids(prompt, n):
    out = subprocess.run([binary, "generate", "--model", model, "--device", "cpu", "--weights", "prepared",
                          "--threads", "2", "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(n)],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return [int(x) for x in out.split(",")]


arrs = m3mono.prepared_arrays(lay)
mspec = m3mono.LayerSpec(lay, -1, arrs["model"])
specs = [m3mono.LayerSpec(lay, l, arrs["layers"][l]) for l in range(lay.num_layers)]
cfg = {t["name"]: t["shape"] for t in lay.layer_tensors(1)}
blocks, bs = 16, info["index_block_size"]
kv_dim = info["num_key_value_heads"] * info["head_dim"]
slots = blocks * bs
caches = []
for l in range(lay.num_layers):
    c = {"k": np.full((slots, kv_dim), np.nan, np.float32), "v": np.full((slots, kv_dim), np.nan, np.float32)}
    if "iq_norm" in {t["name"] for t in lay.layer_tensors(l)}:
        c["ik"] = np.full((slots, info["index_head_dim"]), np.nan, np.float32)
    caches.append(c)
nl = m3mono.NativeLayers(lay, mspec, specs, m3mono.CacheSpec(lay, blocks, caches), threads=2)
vocab = info["vocab_size"]
prompts = [[rng_i % vocab for rng_i in random.sample(range(100000), random.randrange(3, 40))] for _ in range(2)]
tables = [list(range(0, 8)), list(range(8, 16))]  # 8 blocks of 16 positions each: enough for 40 + 6
n_new = 6
seqs = [list(p) for p in prompts]
done = [0, 0]
for step in range(n_new):
    batch = [(done[i], seqs[i][done[i]:], tables[i]) for i in range(2)]
    nl.prepare_step(batch)
    x = nl.embed()
    if step % 2:
        for l in range(lay.num_layers):
            nl.forward_layer(l, x)
    else:  # a range, split in two
        nl.forward_layers(0, 2, x)
        nl.forward_layers(2, lay.num_layers, x)
    lg = nl.logits(x)
    for i in range(2):
        done[i] = len(seqs[i])
        seqs[i].append(int(np.argmax(lg[i])))
for i in range(2):
    got = seqs[i][len(prompts[i]):]
    want = cli_ids(prompts[i], n_new)
    check(got == want, f"NativeLayers loop, sequence {i} ({len(prompts[i])} prompt tokens): greedy ids {got} == "
          f"the engine's {want}")
written = sum(int(np.isfinite(c["k"]).all(axis=1).sum()) for c in caches[:1])
check(written == sum(len(s) - 1 for s in seqs), f"the borrowed K cache of layer 0 holds the {written} positions written")
bad = [dict(c) for c in caches]
bad[2]["v"] = bad[2]["v"].astype(np.float64)
ok, msg = refused(lambda: m3mono.CacheSpec(lay, blocks, bad), "caches[2]['v']", "float32")
check(ok, f"a float64 cache is refused: {msg}")
bad = [dict(c) for c in caches]
bad[1]["k"] = bad[1]["k"][:-1]
ok, msg = refused(lambda: m3mono.CacheSpec(lay, blocks, bad), "caches[1]['k']")
check(ok, f"a short cache is refused: {msg}")
nl.prepare_step([(done[i], seqs[i][done[i]:], tables[i]) for i in range(2)])  # 2 rows: a transpose is not C order
x = nl.embed()
for what, arg in (("float64", x.astype(np.float64)), ("a transposed view", np.asfortranarray(x)),
                  ("the wrong rows", np.concatenate([x, x]))):
    try:
        nl.forward_layer(0, arg)
        check(False, f"forward_layer refuses {what} (it would update a converted copy)")
    except (TypeError, m3mono.Error) as e:
        check(True, f"forward_layer refuses {what}: {type(e).__name__}")
ok, msg = refused(lambda: m3mono.NativeLayers(lay, mspec, specs[:-1], m3mono.CacheSpec(lay, blocks, caches)),
                  "layer specs")
check(ok, f"a missing layer is refused: {msg}")
ok, msg = refused(lambda: m3mono.CacheSpec(lay, blocks, caches, device="cuda"), "caches[0]['k']", "CUDA array",
                  "not converted")
check(ok, f"host arrays as GPU caches are refused: {msg}")
ok, msg = refused(lambda: nl.logits(x, out=np.zeros((2, 4), np.float32)), "no `out`")
check(ok, f"the CPU layers' logits take no `out`: {msg}")
ok, msg = refused(lambda: nl.forward_layers(3, 1, np.zeros((1, 1), np.float32)), "float32")
check(ok, f"a residual stream of the wrong shape is refused: {msg}")
other = m3mono.Layout(model)
ok, msg = refused(lambda: m3mono.NativeLayers(lay, mspec, specs, m3mono.CacheSpec(other, blocks, caches)),
                  "another Layout")
check(ok, f"a CacheSpec of another Layout is refused: {msg}")
ok, msg = refused(lambda: nl.forward_layers(3, 1, x), "[3, 1) is not a range")
check(ok, f"a backwards layer range is refused: {msg}")
ok, msg = refused(lambda: m3mono.Mono(lay, mspec, specs, m3mono.CacheSpec(lay, blocks, caches)), "Mono", "CUDA device")
check(ok, f"Mono over host specs is refused: {msg}")
nl.close()
nl.close()
check(nl.closed, "NativeLayers.close() is idempotent")
for what, f in [("prepare_step", lambda: nl.prepare_step([(0, [1], [0])])), ("forward_layers", lambda: nl.forward_layers(0, 1, x)),
                ("num_tokens", lambda: nl.num_tokens)]:
    ok, msg = refused(f, "closed", what)
    check(ok, f"a closed NativeLayers refuses {what}: {msg}")

# tensor parallelism: two ranks as Python threads, each over its own rank arena, specs and caches
import threading  # noqa: E402

group = m3mono.TPGroup(2)
rank_nl, rank_lay = [], []
for r in range(2):
    rl = m3mono.Layout(model, tp_rank=r, tp_size=2)
    ra = m3mono.prepared_arrays(rl)
    rm = m3mono.LayerSpec(rl, -1, ra["model"])
    rs = [m3mono.LayerSpec(rl, l, ra["layers"][l]) for l in range(rl.num_layers)]
    rc = []
    for l in range(rl.num_layers):
        c = {"k": np.full((slots, kv_dim // 2), np.nan, np.float32),
             "v": np.full((slots, kv_dim // 2), np.nan, np.float32)}
        if "iq_norm" in {t["name"] for t in rl.layer_tensors(l)}:
            c["ik"] = np.full((slots, info["index_head_dim"]), np.nan, np.float32)
        rc.append(c)
    rank_lay.append(rl)
    rank_nl.append((rl, rm, rs, m3mono.CacheSpec(rl, blocks, rc)))
ctxs = [group.rank(r) for r in range(2)]
nls = [None, None]


def build(r):
    rl, rm, rs, rc = rank_nl[r]
    nls[r] = m3mono.NativeLayers(rl, rm, rs, rc, threads=1, tp=ctxs[r])


ts = [threading.Thread(target=build, args=(r,)) for r in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
check(all(n is not None for n in nls), "tp 2: both ranks' NativeLayers built")
seq = list(prompts[0])
tp_done = 0
same = True
for step in range(4):
    out = [None, None]

    def run(r):
        nl_r = nls[r]
        nl_r.prepare_step([(tp_done, seq[tp_done:], tables[0])])
        xr = nl_r.embed()
        nl_r.forward_layers(0, rank_lay[r].num_layers, xr)
        out[r] = nl_r.logits(xr)

    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    same = same and out[0] is not None and out[1] is not None and np.array_equal(out[0], out[1]) and \
        out[0].shape == (1, vocab) and np.isfinite(out[0]).all()
    tp_done = len(seq)
    seq.append(int(np.argmax(out[0][0])))
check(same, f"tp 2: both ranks return the same full-vocabulary logits every step (ids {seq[len(prompts[0]):]})")
ok, msg = refused(lambda: m3mono.NativeLayers(rank_nl[1][0], rank_nl[1][1], rank_nl[1][2], rank_nl[1][3],
                                              tp=m3mono.TPGroup(2).rank(0)), "rank 1 of 2", "rank 0 of 2")
check(ok, f"a rank's tensors under another rank's context are refused: {msg}")
ok, msg = refused(lambda: m3mono.NativeLayers(rank_nl[0][0], rank_nl[0][1], rank_nl[0][2], rank_nl[0][3]),
                  "rank 0 of 2", "rank 0 of 1")
check(ok, f"a rank's tensors without a context are refused: {msg}")

print(f"{len(fails)} failure(s)")
sys.exit(1 if fails else 0)
