#!/usr/bin/env bash
# CTest script test of `m3mono tokenize` / `m3mono detokenize` on a make-tiny checkpoint (whose
# tokenizer.json make-tiny writes): the ids equal the Python `tokenizers` library's on the same file,
# detokenize(tokenize(x)) == x, --help names the flags, and every bad input fails with a non-zero
# exit and a message naming the flag or the file.
#   bash tokenize_cli.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: tokenize_cli.sh <m3mono-binary> <source-dir>}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-tiny --out "$tmp/tiny" >/dev/null
[[ -f "$tmp/tiny/tokenizer.json" ]] || fail "make-tiny wrote no tokenizer.json"

"$bin" tokenize --help >"$tmp/h1.txt"
"$bin" detokenize --help >"$tmp/h2.txt"
for s in "--model" "--text " "--text-file" "--no-special-tokens" "Prints {\"ids\": [...]}"; do
  grep -qF -- "$s" "$tmp/h1.txt" || { cat "$tmp/h1.txt"; fail "tokenize --help does not say '$s'"; }
done
for s in "--model" "--ids" "--skip-special-tokens" "followed by one newline"; do
  grep -qF -- "$s" "$tmp/h2.txt" || { cat "$tmp/h2.txt"; fail "detokenize --help does not say '$s'"; }
done
"$bin" --help | grep -q "tokenize" || fail "m3mono --help does not list tokenize"

python3 - "$bin" "$tmp" <<'PY'
import json, subprocess, sys
from tokenizers import Tokenizer
bin, tmp = sys.argv[1], sys.argv[2]
model = f"{tmp}/tiny"
ref = Tokenizer.from_file(f"{model}/tokenizer.json")
texts = ["Hello world!", "]~!b[]~b]system\nYou are helpful.[e~[\n]~b]ai\n<mm:think>hmm</mm:think>ok[e~[",
         "  leading and trailing  ", "数字 123456 and emoji 😀👍🏽", "]<]minimax[>[<tool_call>\n<invoke name=\"f\">",
         "tabs\tand\nnewlines\r\n\r\n", "e\u0301 caf\u00e9", ""]
for k, t in enumerate(texts):
    r = subprocess.run([bin, "tokenize", "--model", model, "--text", t], capture_output=True, text=True)
    assert r.returncode == 0, (t, r.stderr)
    got = json.loads(r.stdout)["ids"]
    want = ref.encode(t).ids
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sys.exit(f"FAIL: tokenize {t!r}: ids differ at position {i}: got {got[i:i+3]}, want {want[i:i+3]}")
    with open(f"{tmp}/t{k}.txt", "w", encoding="utf-8", newline="") as f:
        f.write(t)
    r2 = subprocess.run([bin, "tokenize", "--model", model, "--text-file", f"{tmp}/t{k}.txt"], capture_output=True, text=True)
    assert r2.returncode == 0 and json.loads(r2.stdout)["ids"] == want, (t, r2.stdout, r2.stderr)
    if want:
        ids = ",".join(map(str, want))
        r3 = subprocess.run([bin, "detokenize", "--model", model, "--ids", ids], capture_output=True)
        assert r3.returncode == 0, r3.stderr
        out = r3.stdout.decode("utf-8")
        assert out == t + "\n", (t, out)
        assert out[:-1] == ref.decode(want, skip_special_tokens=False)
        r4 = subprocess.run([bin, "detokenize", "--model", model, "--ids", ids, "--skip-special-tokens"], capture_output=True)
        assert r4.stdout.decode("utf-8")[:-1] == ref.decode(want, skip_special_tokens=True), (t, r4.stdout)
print(f"tokenize/detokenize: {len(texts)} strings equal the tokenizers library")
PY

# --messages: the chat template (make-tiny's chat_template.jinja) rendered by Python jinja2 as
# transformers configures it (tests/py/jinja_oracle.py), encoded by the tokenizers library without
# special tokens, equals `m3mono tokenize --messages`; random conversations, seed printed.
[[ -f "$tmp/tiny/chat_template.jinja" ]] || fail "make-tiny wrote no chat_template.jinja"
python3 - "$bin" "$tmp" "$2" <<'PY'
import json, os, random, subprocess, sys
from tokenizers import Tokenizer
bin, tmp, src = sys.argv[1], sys.argv[2], sys.argv[3]
model = f"{tmp}/tiny"
seed = int(os.environ.get("M3_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
print(f"tokenize --messages: seed {seed}")
rng = random.Random(seed)
ref = Tokenizer.from_file(f"{model}/tokenizer.json")
source = open(f"{model}/chat_template.jinja", encoding="utf-8").read()
words = ["hello", "wörld", "你好", "😀", "the robot", "42", "\n", "  ", "<mm:think>", "[e~[", "weather"]
say = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
runs = []
for k in range(12):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": rng.choice(["system", "developer"]), "content": say()})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": say()})
        if rng.random() < 0.7:
            m = {"role": rng.choice(["assistant", "ai"]), "content": say()}
            if rng.random() < 0.4:
                m["reasoning_content"] = say()
            if rng.random() < 0.3:
                m["tool_calls"] = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": say()}}}]
                msgs += [m, {"role": "tool", "content": say()}]
                continue
            msgs.append(m)
    doc = {"messages": msgs, "tools": [tool]} if rng.random() < 0.4 else msgs
    gen = rng.random() < 0.6
    kwargs = {"thinking_mode": rng.choice(["enabled", "disabled", "adaptive"])} if rng.random() < 0.7 else {}
    path = f"{tmp}/chat{k}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    ctx = dict(doc) if isinstance(doc, dict) else {"messages": doc}
    ctx["add_generation_prompt"] = gen
    ctx.update(kwargs)
    args = [bin, "tokenize", "--model", model, "--messages", path] + (["--add-generation-prompt"] if gen else [])
    if kwargs:
        args += ["--template-kwargs", json.dumps(kwargs)]
    runs.append((args, ctx))
with open(f"{tmp}/oracle_in.json", "w", encoding="utf-8") as f:
    json.dump({"templates": {"tiny": source}, "cases": [{"template": "tiny", "context": c} for _, c in runs]}, f,
              ensure_ascii=False)
subprocess.run([sys.executable, f"{src}/tests/py/jinja_oracle.py", f"{tmp}/oracle_in.json", f"{tmp}/oracle_out.json"],
               check=True)
oracle = json.load(open(f"{tmp}/oracle_out.json", encoding="utf-8"))
for (args, ctx), want in zip(runs, oracle):
    assert want["ok"], want
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stderr)
    got = json.loads(r.stdout)["ids"]
    ids = ref.encode(want["text"], add_special_tokens=False).ids
    if got != ids:
        sys.exit(f"FAIL: tokenize --messages {args[5]} (seed {seed}): {len(got)} ids, want {len(ids)}; rendered:\n{want['text']}")
    assert ids[0] == ref.token_to_id("]~!b["), "the rendered chat starts with the BOS marker"
print(f"tokenize --messages: {len(runs)} conversations equal jinja2 + the tokenizers library")
PY

# bad input: non-zero exit, a message naming the flag or file
expect_error() {  # <needle> <args...>
  local needle="$1"; shift
  if "$bin" "$@" >"$tmp/out.txt" 2>&1; then cat "$tmp/out.txt"; fail "'$*' succeeded"; fi
  grep -qF -- "$needle" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "'$*': message lacks '$needle'"; }
}
printf 'ok \xc3(' >"$tmp/bad.txt"
mkdir -p "$tmp/notok" && cp "$tmp/tiny/config.json" "$tmp/notok/"
expect_error "give exactly one of --text, --text-file and --messages" tokenize --model "$tmp/tiny"
echo '[{"role": "user", "content": "hi"}]' >"$tmp/m1.json"
echo '{"messages": [{"content": "no role"}]}' >"$tmp/m2.json"
echo '{"messages": [], "extra": 1}' >"$tmp/m3.json"
echo '[{"role": "wizard", "content": "hi"}]' >"$tmp/m4.json"
echo '[{"role": "user"' >"$tmp/m5.json"
expect_error "--add-generation-prompt and --template-kwargs go with --messages" tokenize --model "$tmp/tiny" --text hi --add-generation-prompt
expect_error "messages[0] must be an object with a string \"role\"" tokenize --model "$tmp/tiny" --messages "$tmp/m2.json"
expect_error "unknown key \"extra\"" tokenize --model "$tmp/tiny" --messages "$tmp/m3.json"
expect_error "unknown role 'wizard'" tokenize --model "$tmp/tiny" --messages "$tmp/m4.json"
expect_error "--messages '$tmp/m5.json' is not valid JSON" tokenize --model "$tmp/tiny" --messages "$tmp/m5.json"
expect_error "--template-kwargs must be a JSON object" tokenize --model "$tmp/tiny" --messages "$tmp/m1.json" --template-kwargs '[1]'
expect_error "thinking_mode must be" tokenize --model "$tmp/tiny" --messages "$tmp/m1.json" --template-kwargs '{"thinking_mode": "loud"}'
expect_error "--messages: cannot open" tokenize --model "$tmp/tiny" --messages "$tmp/missing.json"
expect_error "--text-file" tokenize --model "$tmp/tiny" --text hi --text-file "$tmp/bad.txt"
expect_error "--text-file '$tmp/bad.txt' is not valid UTF-8 (byte 3" tokenize --model "$tmp/tiny" --text-file "$tmp/bad.txt"
expect_error "--text-file: cannot open" tokenize --model "$tmp/tiny" --text-file "$tmp/missing.txt"
expect_error "has no tokenizer.json" tokenize --model "$tmp/notok" --text hi
expect_error "is not a directory" tokenize --model "$tmp/nowhere" --text hi
expect_error "--model is required" tokenize --text hi
expect_error "--ids entry 'x' is not an integer" detokenize --model "$tmp/tiny" --ids 1,x
expect_error "--ids entry 1 (5000) is outside the vocabulary [0, 1024)" detokenize --model "$tmp/tiny" --ids 1,5000
expect_error "--ids entry -3 is out of range" detokenize --model "$tmp/tiny" --ids -3
expect_error "--ids is required" detokenize --model "$tmp/tiny"
cp "$tmp/tiny/tokenizer.json" "$tmp/notok/"
expect_error "needs the checkpoint's chat template" tokenize --model "$tmp/notok" --messages "$tmp/m1.json"
echo "tokenize_cli: ok"
