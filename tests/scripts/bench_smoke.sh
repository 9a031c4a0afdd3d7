#!/usr/bin/env bash
# CTest smoke test of `m3mono bench --device cpu` (the CPU smoke mode: tiny shapes, reference
# engine): runs a few steps of decode and prefill cases, then validates the JSON report (schema,
# one result per case, finite median <= p90, positive floor, per-op bytes summing to the total)
# and that bad arguments fail with a message naming the flag. Keeps the bench from rotting in CI.
#   bash bench_smoke.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: bench_smoke.sh <m3mono-binary> <source-dir>}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$bin" bench --device cpu --preset tiny --layers 2 --batch 1,2 --context 0,40 --prefill 24 \
  --steps 4 --warmup 1 --threads 2 --commit smoke --json "$tmp/out.json" >"$tmp/table.txt"
cat "$tmp/table.txt"
grep -q "decode b=2 ctx=40" "$tmp/table.txt" || { echo "FAIL: table lacks the b=2 ctx=40 row"; exit 1; }

python3 - "$tmp/out.json" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1]))
def need(cond, msg):
    if not cond:
        print("FAIL:", msg); sys.exit(1)
need(d["schema"] == "m3mono-bench/1", "schema")
need(d["mode"] == "cpu" and d["commit"] == "smoke", "mode / commit")
for k in ("date", "device", "command", "model", "timing", "bandwidth", "cases", "kernels", "notes"):
    need(k in d, "missing key " + k)
need(d["bandwidth"]["copy_GBps"] > 0, "copy bandwidth")
need(d["model"]["layers"] == 2, "layers")
cases = d["cases"]
need(len(cases) == 5, "expected 5 cases, got %d" % len(cases))
need([c["mode"] for c in cases].count("prefill") == 1, "one prefill case")
for c in cases:
    need(c["floor_us"] > 0 and c["bytes"]["total"] > 0, c["label"] + ": floor")
    ops = sum(o["bytes"] for o in c["bytes"]["ops"])
    need(abs(ops - c["bytes"]["total"]) <= 1e-9 * c["bytes"]["total"], c["label"] + ": op bytes sum")
    need(len(c["paths"]) == 1 and c["paths"][0]["path"] == "cpu-ref", c["label"] + ": paths")
    p = c["paths"][0]
    need(p["samples"] == 4, c["label"] + ": samples")
    need(math.isfinite(p["median_us"]) and 0 < p["median_us"] <= p["p90_us"], c["label"] + ": median/p90")
    need(abs(p["achieved_fraction"] - c["floor_us"] / p["median_us"]) < 1e-9, c["label"] + ": fraction")
print("bench JSON ok: %d cases" % len(cases))
PY

# bad input fails, naming the flag
if "$bin" bench --device cpu --context 8X --steps 1 >"$tmp/bad.txt" 2>&1; then
  echo "FAIL: --context 8X accepted"; exit 1
fi
grep -q -- "--context" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; echo "FAIL: error does not name --context"; exit 1; }
echo "bench smoke ok"
