#!/usr/bin/env bash
# Device call for speculative decoding's speed at concurrency 1 (issue 18): `m3mono generate
# --device cuda` on synthetic checkpoints (make-tiny PRESETS, default "tiny real-heads") with a
# repetitive prompt (the ids 11..18 eight times), MAX_TOKENS (256) tokens greedy, for each of
# plain decoding and `--speculative ngram` (3 drafts), natively and with --mono, REPS (3) runs each:
# decode tokens/s, the steps per path and the drafts kept. The random weights' greedy output falls
# into repeats of its own, which is what prompt-lookup drafts find; a real model's acceptance on
# real text is another figure. Output ids of plain and speculative runs must be equal (checked).
#   scripts/gpu-spec.sh BIN          (BIN as scripts/gpubin.sh leaves it; unpacked here if *.xz)
# Logs under $OUT (default /tmp/gpu-spec); a table last. Exit 1 when a run fails or ids differ.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-spec.sh BIN}
OUT=${OUT:-/tmp/gpu-spec}
mkdir -p "$OUT"
ls "$BIN"/*.xz >/dev/null 2>&1 && [ ! -x "$BIN/m3mono" ] && scripts/gpubin.sh unpack "$BIN" >/dev/null
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
M="$BIN/m3mono"
prompt=$(for r in 1 2 3 4 5 6 7 8; do printf '11,12,13,14,15,16,17,18,'; done)
prompt=${prompt%,}
table="$OUT/table.txt"
: >"$table"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$table" 2>&1
rc=0
for preset in ${PRESETS:-tiny real-heads}; do
  model="$OUT/model-$preset"
  rm -rf "$model"
  "$M" make-tiny --out "$model" --preset "$preset" >"$OUT/make-$preset.log" 2>&1 || { echo "make-tiny $preset failed" >>"$table"; rc=1; continue; }
  for path in native mono; do
    flag=()
    [ $path = mono ] && flag=(--mono)
    for spec in none ngram; do
      for r in $(seq 1 "${REPS:-3}"); do
        log="$OUT/gen-$preset-$path-$spec-$r.log"
        timeout 120 "$M" generate --model "$model" --device cuda --prompt-ids "$prompt" \
          --max-tokens "${MAX_TOKENS:-256}" --speculative "$spec" "${flag[@]}" >"$log" 2>&1 ||
          { echo "$preset $path $spec run $r failed (exit $?)" >>"$table"; rc=1; continue; }
        ids=$(tail -1 "$log")
        ref="$OUT/ids-$preset.txt"
        [ -f "$ref" ] || echo "$ids" >"$ref"
        [ "$ids" = "$(cat "$ref")" ] || { echo "$preset $path $spec run $r: ids differ from the first run's" >>"$table"; rc=1; }
        tps=$(grep -oE '^decode: .*\(([0-9.]+) tokens/s\)' "$log" | grep -oE '[0-9.]+ tokens/s')
        steps=$(grep -E '^steps per path' "$log" | sed 's/steps per path: //')
        acc=$(grep -oE 'acceptance length [0-9.]+' "$log")
        echo "$preset | $path | $spec | run $r | $tps | steps: $steps | ${acc:-}" >>"$table"
      done
    done
  done
done
cat "$table"
exit $rc
