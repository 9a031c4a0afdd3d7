"""The Python module against the CLI (run by tests/scripts/python_module.sh with PYTHONPATH set to
<build>/python): LLM.generate on the fixtures equals `m3mono generate` (greedy and seeded
sampling), string prompts through the checkpoint's tokenizer equal their ids, tp=2 equals tp=1,
make_tiny writes a loadable checkpoint, info reports the spec, speculative decoding (n-gram and
EAGLE3 drafts) gives the greedy ids of plain decoding, and bad input raises m3mono.Error (a
ValueError) naming what is wrong, without killing the interpreter."""
import os
import random
import subprocess
import sys
import tempfile

import m3mono

binary, src = sys.argv[1], sys.argv[2]
fails = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        fails.append(what)


def cli_ids(model, prompt, n, extra=()):
    out = subprocess.run([binary, "generate", "--model", model, "--device", "cpu", "--threads", "2",
                          "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(n), *extra],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return [int(x) for x in out.split(",")]


rng = random.Random()
for name in ("tiny-m3-a", "tiny-m3-b"):
    model = os.path.join(src, "tests", "data", name)
    llm = m3mono.LLM(model, device="cpu", threads=2)
    vocab = m3mono.info(model)["vocab_size"]
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(3, 40))]
    got = llm.generate(prompt, m3mono.SamplingParams(max_tokens=12))[0]
    check(got.token_ids == cli_ids(model, prompt, 12), f"{name}: greedy ids equal the CLI's ({llm.name})")
    check(got.prompt_token_ids == prompt, f"{name}: the output carries its prompt ids")
    seed = rng.randrange(1 << 30)
    sp = m3mono.SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=50, seed=seed)
    got = llm.generate([prompt], sp)[0].token_ids
    want = cli_ids(model, prompt, 10, ["--temperature", "0.8", "--top-p", "0.9", "--top-k", "50", "--seed", str(seed)])
    check(got == want, f"{name}: seeded sampling (seed {seed}) equals the CLI's")

model = os.path.join(src, "tests", "data", "tiny-m3-a")
one, two = m3mono.LLM(model, device="cpu", threads=2), m3mono.LLM(model, device="cpu", tp=2, threads=2)
p = [5, 6, 7, 8, 9]
check(two.generate(p)[0].token_ids == one.generate(p)[0].token_ids, "tp=2 gives tp=1's greedy ids")
check("tp2" in two.name, f"the tp=2 engine says so ({two.name})")
try:
    m3mono.LLM(model, device="cpu", tp=2, tp_comm="carrier-pigeon")
    check(False, "a bad tp_comm is refused")
except m3mono.Error as e:
    check("--tp-comm" in str(e) and "carrier-pigeon" in str(e), f"a bad tp_comm is refused naming it: {e}")

with tempfile.TemporaryDirectory() as d:
    path = m3mono.make_tiny(os.path.join(d, "tiny"), seed=rng.randrange(1000))
    i = m3mono.info(path)
    check(i["num_layers"] == 4 and i["vocab_size"] == 1024, f"make_tiny + info: {i}")
    llm = m3mono.LLM(path, device="cpu", threads=2)
    outs = llm.generate(["Hello, world", [1, 2, 3]], m3mono.SamplingParams(max_tokens=6))
    check(len(outs) == 2 and all(len(o.token_ids) == 6 for o in outs), "two prompts, six tokens each")
    ids = llm.encode("Hello, world")
    check(outs[0].prompt_token_ids == ids, "a string prompt goes through the checkpoint's tokenizer")
    check(outs[0].token_ids == llm.generate(ids, m3mono.SamplingParams(max_tokens=6))[0].token_ids,
          "a string prompt gives its ids' tokens")
    check(isinstance(outs[0].text, str) and outs[0].text == llm.decode(outs[0].token_ids), "text is the decoded ids")


def raises(fn, needle, what):
    try:
        fn()
    except m3mono.Error as e:
        check(needle in str(e) and isinstance(e, ValueError), f"{what}: m3mono.Error ({e})")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: {type(e).__name__} instead of m3mono.Error: {e}")
        return
    check(False, f"{what}: no error")


# speculative decoding: greedy outputs are those of plain decoding (n-gram and EAGLE3 drafts)
with tempfile.TemporaryDirectory() as d:
    path = m3mono.make_tiny(os.path.join(d, "tiny"), seed=rng.randrange(1000), eagle3=True)
    plain = m3mono.LLM(path, device="cpu", threads=2)
    for method, draft in (("ngram", None), ("eagle3", os.path.join(path, "eagle3"))):
        spec = m3mono.LLM(path, device="cpu", threads=2, speculative=method, draft_model=draft, num_draft_tokens=3)
        for k in range(3):
            pat = [rng.randrange(1024) for _ in range(3)]
            prompt = pat * 4 if k % 2 == 0 else [rng.randrange(1024) for _ in range(rng.randrange(2, 30))]
            want = plain.generate(prompt, m3mono.SamplingParams(max_tokens=16))[0].token_ids
            got = spec.generate(prompt, m3mono.SamplingParams(max_tokens=16))[0].token_ids
            st = spec.speculative_stats
            # n-gram drafts need a repeat (a random prompt may have none); EAGLE3 drafts every step
            drafts_expected = method == "eagle3" or k % 2 == 0
            check(got == want and (st["verify_steps"] > 0 or not drafts_expected) and
                  st["drafted"] >= st["accepted"] >= 0, f"{method} prompt {k}: greedy ids equal plain decoding ({st})")
    raises(lambda: m3mono.LLM(path, device="cpu", speculative="eagle3"), "--draft-model", "eagle3 without a draft")
    raises(lambda: m3mono.LLM(path, device="cpu", speculative="medusa"), "medusa", "an unknown speculative method")
    raises(lambda: m3mono.LLM(path, device="cpu", speculative="eagle3", draft_model=os.path.join(path, "eagle3"),
                              draft_device="tpu"), "--draft-device", "an unknown draft device")
    raises(lambda: m3mono.LLM(path, device="cpu", speculative="eagle3", draft_model=path), "LlamaForCausalLMEagle3",
           "a target checkpoint given as the draft")

raises(lambda: m3mono.LLM("/nonexistent/model", device="cpu"), "/nonexistent/model", "a missing model directory")
raises(lambda: m3mono.LLM(model, device="tpu"), "--device", "an unknown device")
raises(lambda: m3mono.LLM(model, device="cpu", tp=3), "not divisible by 3", "a split that does not divide")
raises(lambda: one.generate([1, 2, 99999]), "outside the vocabulary", "a token id past the vocabulary")
raises(lambda: one.generate([1], m3mono.SamplingParams(max_tokens=0)), "max_tokens", "max_tokens 0")
raises(lambda: one.generate([1], m3mono.SamplingParams(temperature=-1)), "temperature", "a negative temperature")
raises(lambda: one.generate([1] * 10, m3mono.SamplingParams(max_tokens=one.max_model_len)), "max_model_len",
       "more tokens than max_model_len")
check(one.generate([1, 2])[0].token_ids == one.generate([1, 2])[0].token_ids, "the engine still works after errors")
raises(lambda: m3mono.LLM(os.path.join(src, "tests", "data", "tiny-m3-b"), device="cpu").encode("x"), "tokenizer",
       "encode without a tokenizer.json")
print(f"{len(fails)} failed" if fails else "all passed")
sys.exit(1 if fails else 0)
