#!/usr/bin/env bash
# CTest script test of `m3mono chat` on a make-tiny checkpoint (tokenizer.json + chat template):
# turns from stdin, /reset, /quit and end of input; greedy answers are the same run to run, and the
# answer after /reset equals a fresh session's; --thinking enabled shows the thinking dimmed with
# --color always and never prints an escape with --color never; bad flags fail naming the flag.
#   bash chat_cli.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: chat_cli.sh <m3mono-binary> <source-dir>}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-tiny --out "$tmp/tiny" >/dev/null
"$bin" chat --help >"$tmp/h.txt"
for s in "--model" "--thinking" "--system" "--max-tokens" "--color" "--temperature"; do
  grep -qF -- "$s" "$tmp/h.txt" || { cat "$tmp/h.txt"; fail "chat --help does not say '$s'"; }
done
"$bin" --help | grep -q "chat" || fail "m3mono --help does not list chat"

chat() { "$bin" chat --model "$tmp/tiny" --device cpu --max-tokens 10 --color never "$@" 2>"$tmp/err.txt"; }
printf 'Hello there\n/reset\nWie geht es dir?\n/quit\nnever read\n' | chat >"$tmp/a.txt" || { cat "$tmp/err.txt"; fail "chat failed"; }
printf 'Hello there\n/reset\nWie geht es dir?\n/quit\n' | chat >"$tmp/b.txt"
cmp -s "$tmp/a.txt" "$tmp/b.txt" || { diff "$tmp/a.txt" "$tmp/b.txt"; fail "greedy answers differ run to run"; }
grep -q "(conversation reset)" "$tmp/a.txt" || fail "no reset notice"
[[ $(grep -c '^> ' "$tmp/a.txt") -eq 4 ]] || { cat "$tmp/a.txt"; fail "expected four prompts (two turns, /reset and /quit)"; }
# the answer after /reset is a fresh session's answer to the same line (end of input also leaves)
printf 'Wie geht es dir?\n' | chat >"$tmp/c.txt"
second=$(sed -n '3p' "$tmp/a.txt"); fresh=$(sed -n '1p' "$tmp/c.txt")
[[ "${second#> }" == "${fresh#> }" ]] || fail "after /reset: '$second' vs a fresh session: '$fresh'"
# thinking: dimmed with --color always, no escapes with never
printf 'Think!\n' | "$bin" chat --model "$tmp/tiny" --device cpu --max-tokens 6 --thinking enabled --color always \
  2>/dev/null >"$tmp/d.txt"
grep -q $'\x1b\[2m' "$tmp/d.txt" || { od -c "$tmp/d.txt" | head; fail "--thinking enabled --color always shows no dimmed thinking"; }
if grep -q $'\x1b' "$tmp/a.txt"; then fail "--color never printed an escape"; fi
# bad flags
for bad in "--thinking loud" "--color blue" "--max-tokens 0"; do
  # shellcheck disable=SC2086
  if printf 'x\n' | "$bin" chat --model "$tmp/tiny" --device cpu $bad >/dev/null 2>"$tmp/e.txt"; then fail "chat $bad succeeded"; fi
  grep -q -- "${bad%% *}" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "chat $bad: the error does not name ${bad%% *}"; }
done
if "$bin" chat --model "$tmp/nowhere" </dev/null >/dev/null 2>"$tmp/e.txt"; then fail "chat on a missing directory succeeded"; fi
grep -q "nowhere" "$tmp/e.txt" || fail "the error does not name the directory"
echo "chat CLI: turns, reset, determinism, thinking display and errors OK"
