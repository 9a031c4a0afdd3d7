#!/usr/bin/env bash
# The whole-step benchmark of issue 4 at MiniMax-M3 scale, one command: one TP-4 rank of the real
# model (60 layers, random weights on the GPU), decode batches 1-16 at context 8K and a prefill of
# 8K tokens, the "stream" (plain read of the step's bytes) and "native" (CudaBackend) paths side
# by side, plus the per-kernel benches. Writes OUT/bench.txt (the table, also on stdout),
# OUT/bench.json, OUT/bench.log (stderr) and, when matplotlib is there, OUT/bench.png.
#
#   scripts/bench-native.sh [OUT (default bench-out)] [extra m3mono bench flags...]
#   M3MONO=path/to/m3mono (default: build/release/m3mono, else m3mono on PATH); M3_COMMIT=<sha>
set -euo pipefail
out=${1:-bench-out}
[ $# -gt 0 ] && shift
bin=${M3MONO:-build/release/m3mono}
[ -x "$bin" ] || bin=$(command -v m3mono)
export M3_COMMIT=${M3_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$out"
chart=()
python3 -c 'import matplotlib' 2>/dev/null && chart=(--chart "$out/bench.png")
"$bin" bench --tp-shard 4 --layers 60 --context 8K --batch 1,2,4,8,16 --prefill 8K --paths stream,native \
  --kernels --json "$out/bench.json" "${chart[@]}" "$@" > "$out/bench.txt" 2> "$out/bench.log" || {
  rc=$?; cat "$out/bench.txt"; tail -20 "$out/bench.log" >&2; exit $rc; }
cat "$out/bench.txt"
