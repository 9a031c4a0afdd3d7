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

# bad input: non-zero exit, a message naming the flag or file
expect_error() {  # <needle> <args...>
  local needle="$1"; shift
  if "$bin" "$@" >"$tmp/out.txt" 2>&1; then cat "$tmp/out.txt"; fail "'$*' succeeded"; fi
  grep -qF -- "$needle" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "'$*': message lacks '$needle'"; }
}
printf 'ok \xc3(' >"$tmp/bad.txt"
mkdir -p "$tmp/notok" && cp "$tmp/tiny/config.json" "$tmp/notok/"
expect_error "give exactly one of --text and --text-file" tokenize --model "$tmp/tiny"
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
echo "tokenize_cli: ok"
