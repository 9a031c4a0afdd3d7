#!/usr/bin/env bash
# Where the warps of one mono launch stall, beside native kernels of the same bodies: one device
# call that profiles, inside `m3mono bench` (one TP-4 rank, LAYERS (4) sparse layers, 8K, batch 1),
# the LAUNCH-th (default 3) launch of the mono kernel and of each native kernel in KERNELS (regexes
# over demangled names; default the attention split, the FP8 decode tile and the MXFP4 experts),
# with the stall reasons per issued instruction, instructions executed, active warps and duration
# (ncu raw metrics; caches and clocks left as they are). Prints one table (a column per kernel);
# the raw CSVs stay under $OUT (default /tmp/ncu-mono), a few KB each.
#   scripts/ncu-mono.sh BIN [KERNELS]   (BIN as scripts/gpubin.sh leaves it; unpacked here if *.xz)
# First run (H100, 2026-12-07 19:40 UTC, docs/perf.md): mono's no-instruction stall 0.61 cycles
# per issued instruction against 0.04-0.16 in the native kernels.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: ncu-mono.sh BIN [KERNELS]}
KERNELS=${2:-"AttentionSplitOp MmaDecodeOp MoeWideOp"}
OUT=${OUT:-/tmp/ncu-mono}
mkdir -p "$OUT"
ls "$BIN"/*.xz >/dev/null 2>&1 && [ ! -x "$BIN/m3mono" ] && scripts/gpubin.sh unpack "$BIN" >/dev/null
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
METRICS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,smsp__warps_active.avg.per_cycle_active'
for k in mono_kernel $KERNELS; do
  paths=native
  [ "$k" = mono_kernel ] && paths=native,mono
  timeout "${NCU_S:-150}" "$NCU" --clock-control none --cache-control none --kernel-name-base demangled \
    --kernel-name "regex:$k" --launch-skip "$(( ${LAUNCH:-3} - 1 ))" --launch-count 1 --metrics "$METRICS" \
    --csv --page raw "$BIN/m3mono" bench --tp-shard 4 --layers "${LAYERS:-4}" --context 8K --batch 1 \
    --paths "$paths" --steps 2 --warmup 0 >"$OUT/$k.csv" 2>"$OUT/$k.err"
  echo "ncu $k: rc=$?"
done
python3 - "$OUT" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
res, cols = {}, []
for f in sorted(glob.glob(os.path.join(out, '*.csv'))):
    rows = [r for r in csv.reader(open(f)) if r]
    hdr = next((i for i, r in enumerate(rows) if 'Kernel Name' in r), None)
    if hdr is None or len(rows) <= hdr + 1:
        print(os.path.basename(f), ': no data')
        continue
    k = os.path.basename(f)[:-4]
    cols.append(k)
    for h, v in zip(rows[hdr], rows[-1]):  # the last row holds the values (a units row may precede)
        if h.startswith('smsp__') or h.startswith('gpu__'):
            res.setdefault(h, {})[k] = v
short = lambda h: h.replace('smsp__average_warps_issue_stalled_', 'stall ').replace('_per_issue_active.ratio', '')
print('metric'.ljust(44), ' '.join(c[:16].rjust(16) for c in cols))
for h in sorted(res):
    vals = [res[h].get(c, '-') for c in cols]
    try:
        if 'stalled' in h and max(float(v.replace(',', '')) for v in vals if v != '-') < 0.05:
            continue
    except ValueError:
        pass
    print(short(h)[:44].ljust(44), ' '.join(v[:16].rjust(16) for v in vals))
EOF
