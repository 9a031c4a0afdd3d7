#!/usr/bin/env python3
"""Where two GpuBitsDump files differ: per step of NEW.idx (written by GpuBitsDump beside its
file; an older tree's file has the same order), the rows whose bits differ and the largest
relative difference, for the first 6 differing steps, then the list of every differing step.
   scripts/bits-diff.py OLD.bin NEW.bin [NEW.bin.idx]"""
import struct
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    idx = sys.argv[3] if len(sys.argv) > 3 else new + ".idx"
    a, b = open(old, "rb").read(), open(new, "rb").read()
    if len(a) != len(b):
        print(f"sizes differ: {len(a)} and {len(b)} bytes")
    shown = 0
    steps = []  # every differing step, also past the ones shown in detail
    for line in open(idx):
        preset, kv, step, first, rows, vocab = line.split()
        first, rows, vocab = int(first), int(rows), int(vocab)
        lo, hi = first * vocab * 4, (first + rows) * vocab * 4
        if a[lo:hi] == b[lo:hi]:
            continue
        steps.append(f"{preset}/{kv}/{step}")
        if shown >= 6:
            continue
        bad, missing, worst = 0, 0, 0.0
        for r in range(rows):
            ra, rb = a[lo + r * vocab * 4: lo + (r + 1) * vocab * 4], b[lo + r * vocab * 4: lo + (r + 1) * vocab * 4]
            if ra == rb:
                continue
            bad += 1
            if len(ra) != vocab * 4 or len(rb) != vocab * 4:  # past the end of a shorter file
                missing += 1
                continue
            fa, fb = struct.unpack(f"{vocab}f", ra), struct.unpack(f"{vocab}f", rb)
            m = max(abs(x) for x in fa) or 1.0
            worst = max(worst, max(abs(x - y) for x, y in zip(fa, fb)) / m)
        gone = f" ({missing} past the end of a file)" if missing else ""
        print(f"{preset} {kv} step {step}: {bad} of {rows} rows differ{gone}, max |d| / max |old| {worst:.3g}")
        shown += 1
    if len(steps) > shown:
        print(f"{len(steps)} steps differ in all (preset/cache/step): {' '.join(steps)}")
    if shown == 0:
        print("identical" if a == b else "the indexed rows are identical; the files differ past them")


if __name__ == "__main__":
    main()
