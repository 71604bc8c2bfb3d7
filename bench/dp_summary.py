"""Per-run medians of `helios train` logs: where a data-parallel step's time goes.

Usage: python3 bench/dp_summary.py OUTDIR RUN...   (each RUN a directory OUTDIR/RUN/log.csv)

Steps 51 on only (the first step compiles; the next ones may still settle). `host gap` is
the step's wall time less the GPU time of its phases: what the GPU spent waiting for the
host. A `comm` much above a world of one's (about 0.6 ms for GPT-2 bf16 on an H200) means
the ranks waited for each other: compare its mean and p90 with its median.
"""
import csv
import os
import statistics as st
import sys


def q(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def main():
    out, runs = sys.argv[1], sys.argv[2:]
    print(f"{'run':14} {'n':>4} | {'step med':>8} {'mean':>6} {'p90':>6} | {'fwd':>5} {'bwd':>5} "
          f"{'comm':>5} {'c-mean':>6} {'c-p90':>6} {'opt':>5} | {'gpu sum':>7} {'host gap':>8}")
    for name in runs:
        path = os.path.join(out, name, "log.csv")
        if not os.path.exists(path):
            print(f"{name:14} no log.csv")
            continue
        rows = [r for r in csv.DictReader(open(path)) if int(r["step"]) > 50]
        if not rows:
            print(f"{name:14} fewer than 51 steps")
            continue
        col = lambda k: [float(r[k] or 0) for r in rows]
        s, f, b, c, o = (col(k) for k in ("step_ms", "fwd_ms", "bwd_ms", "comm_ms", "opt_ms"))
        gpu = [w + x + y + z for w, x, y, z in zip(f, b, c, o)]
        gap = [a - g for a, g in zip(s, gpu)]
        m = st.median
        print(f"{name:14} {len(rows):4} | {m(s):8.2f} {st.mean(s):6.2f} {q(s, .9):6.2f} | "
              f"{m(f):5.2f} {m(b):5.2f} {m(c):5.2f} {st.mean(c):6.2f} {q(c, .9):6.2f} {m(o):5.2f} | "
              f"{m(gpu):7.2f} {m(gap):8.2f}")


if __name__ == "__main__":
    main()
