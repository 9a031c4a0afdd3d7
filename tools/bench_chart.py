#!/usr/bin/env python3
"""Chart of an `m3mono bench --json` report: step latency against batch (one panel per context
length, one line per path) with the floor (the step's bytes over the measured copy bandwidth)
drawn dashed; prefill cases, if any, in a last panel as tokens/s against prompt length.

    python3 tools/bench_chart.py bench.json bench.png

Needs matplotlib (present on the GPU machine); nothing in CI runs this script.
"""
import json
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        rep = json.load(f)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode = [c for c in rep["cases"] if c["mode"] == "decode"]
    prefill = [c for c in rep["cases"] if c["mode"] == "prefill"]
    contexts = sorted({c["context"] for c in decode})
    panels = len(contexts) + (1 if prefill else 0)
    if panels == 0:
        print("bench_chart: no cases in " + argv[1], file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4), squeeze=False)
    axes = axes[0]
    paths = []
    for c in rep["cases"]:
        for p in c["paths"]:
            if p["path"] not in paths:
                paths.append(p["path"])

    for ax, ctx in zip(axes, contexts):
        cs = sorted((c for c in decode if c["context"] == ctx), key=lambda c: c["batch"])
        xs = [c["batch"] for c in cs]
        for name in paths:
            pts = [(c["batch"], p["median_us"], p["p90_us"]) for c in cs for p in c["paths"] if p["path"] == name]
            if pts:
                ax.errorbar([x for x, _, _ in pts], [m for _, m, _ in pts],
                            yerr=[[0] * len(pts), [q - m for _, m, q in pts]], marker="o", capsize=3,
                            label=name + " (median, p90)")
        ax.plot(xs, [c["floor_us"] for c in cs], "k--", label="floor (bytes / copy bandwidth)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("decode rows (batch)")
        ax.set_ylabel("step latency (us)")
        ax.set_title("context %s" % fmt_count(ctx))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    if prefill:
        ax = axes[-1]
        cs = sorted(prefill, key=lambda c: c["prefill"])
        for name in paths:
            pts = [(c["prefill"], p["tokens_per_s"]) for c in cs for p in c["paths"] if p["path"] == name]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
        floor = [(c["prefill"], c["tokens"] / (max(c["floor_us"], c["flop_floor_us"] or 0) * 1e-6)) for c in cs]
        ax.plot([x for x, _ in floor], [y for _, y in floor], "k--x", label="ceiling (max of byte and FLOP floors)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("tokens / s")
        ax.set_title("prefill")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    m = rep["model"]
    fig.suptitle("%s | %s, %d layers, tp-shard %d | %s | commit %s" %
                 (rep["device"], m["name"], m["layers"], m["tp_shard"], rep["date"], rep["commit"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


def fmt_count(v):
    if v >= 1 << 20 and v % (1 << 20) == 0:
        return "%dM" % (v >> 20)
    if v >= 1 << 10 and v % (1 << 10) == 0:
        return "%dK" % (v >> 10)
    return str(v)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
