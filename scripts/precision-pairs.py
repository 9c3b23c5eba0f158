#!/usr/bin/env python3
"""bf16 against f32, seed by seed, in a sweep crossed with `--grid train.precision=f32,bf16`.

`ember report` compares each QK-norm variant with `none` within a precision; this compares the
precisions within a variant: for every variant and peak learning rate, the paired difference
bf16 − f32 (same seed: same initial weights and batches) of the final validation loss and of
the peak attention logit, and per variant the same for Wortsman et al.'s LR sensitivity (the
report's per-seed values). Mean with a two-sided 95% t interval over the seeds; diverged runs
are counted, never averaged. Needs scipy (the t quantile).

Usage: scripts/precision-pairs.py SWEEP_DIR   (reads SWEEP_DIR/report.json; prints Markdown)
"""
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats


def interval(diffs, digits):
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        return f"{mean:+.{digits}f} (n = {n})"
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return f"{mean:+.{digits}f} [{mean - half:+.{digits}f}, {mean + half:+.{digits}f}] ({n})"


def main():
    report = json.loads((Path(sys.argv[1]) / "report.json").read_text())
    runs = {}
    diverged = []
    for r in report["runs"]:
        key = (r["levels"][0], r["variant"], r["lr"], r["seed"])
        if r["status"] == "ok":
            runs[key] = r
        elif r["status"] == "diverged":
            diverged.append(r["name"])
    print("bf16 − f32, paired by seed: mean [95% t interval] (seeds)\n")
    print("| variant | peak LR | val loss f32 | Δ val loss | peak logit f32 | Δ peak logit |")
    print("|---|---|---|---|---|---|")
    for v in report["variants"]:
        for lr in report["lrs"]:
            seeds = [s for s in report["seeds"] if ("f32", v, lr, s) in runs and ("bf16", v, lr, s) in runs]
            if not seeds:
                continue
            f = [runs["f32", v, lr, s] for s in seeds]
            b = [runs["bf16", v, lr, s] for s in seeds]
            dl = [y["val_loss"] - x["val_loss"] for x, y in zip(f, b)]
            dm = [y["max_attn_logit"] - x["max_attn_logit"] for x, y in zip(f, b)]
            print(f"| {v} | {lr:g} | {statistics.fmean(x['val_loss'] for x in f):.4f} | {interval(dl, 4)} | "
                  f"{statistics.fmean(x['max_attn_logit'] for x in f):.1f} | {interval(dm, 1)} |")
    sens = {(e["levels"][0], e["variant"]): e for e in report["lr_sensitivity"]}
    if sens:
        print("\nLR sensitivity (the report's per-seed values), bf16 − f32:\n")
        print("| variant | f32 | bf16 | Δ |")
        print("|---|---|---|---|")
    for v in report["variants"]:
        f, b = sens.get(("f32", v)), sens.get(("bf16", v))
        if not f or not b:
            continue
        seeds = sorted(set(f["per_seed"]) & set(b["per_seed"]))
        d = [b["per_seed"][s] - f["per_seed"][s] for s in seeds]
        print(f"| {v} | {f['value']['mean']:.4f} ± {f['value']['std']:.4f} | "
              f"{b['value']['mean']:.4f} ± {b['value']['std']:.4f} | {interval(d, 4)} |")
    print(f"\nDiverged runs: {', '.join(diverged) if diverged else 'none'}.")


if __name__ == "__main__":
    main()
