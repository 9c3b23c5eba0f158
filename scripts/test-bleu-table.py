#!/usr/bin/env python3
"""Paired test-set table for a finished `ember ablate` directory of translation runs.

Reads each run's `test-beam5.json` (written by `ember eval RUN --split test --json`) and,
optionally, BLEU on the lowercased tokenised references (`scripts/lc-tok-bleu.py`), and prints
a markdown table: per variant mean ± std over seeds, and the paired difference vs `none` with a
two-sided 95% t interval (df = n − 1), the same statistics as `ember report`.

    scripts/test-bleu-table.py ABLATION_DIR [--lc-tok]   # --lc-tok needs sacremoses
"""
import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_std(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ablation_dir")
    ap.add_argument("--lc-tok", action="store_true", help="also score on the lowercased tokenised files")
    ap.add_argument("--ember", default="target/release/ember")
    args = ap.parse_args()
    runs = {}
    for d in sorted(Path(args.ablation_dir, "runs").iterdir()):
        m = re.fullmatch(r"(\w+)-lr(.+)-seed(\d+)", d.name)
        f = d / "test-beam5.json"
        if not m or not f.is_file():
            continue
        r = json.loads(f.read_text())
        row = {"bleu": r["bleu"]["score"], "chrf": r["chrf"]["score"], "loss": r["loss"]}
        if args.lc_tok:
            out = subprocess.run([sys.executable, str(Path(__file__).parent / "lc-tok-bleu.py"), str(d / "test-beam5.hyp"),
                                  "--ember", args.ember, "--json"], capture_output=True, text=True, check=True).stdout
            row["lc_tok_bleu"] = json.loads(out)["bleu"]["score"]
        runs[(m[1], m[2], int(m[3]))] = row
    metrics = ["bleu", "chrf", "loss"] + (["lc_tok_bleu"] if args.lc_tok else [])
    names = {"bleu": "test BLEU", "chrf": "test chrF", "loss": "test loss", "lc_tok_bleu": "test BLEU (lc.norm.tok)"}
    print("| variant | seeds | " + " | ".join(names[m] for m in metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    variants = sorted({v for v, _, _ in runs}, key=lambda v: (v != "none", v))
    for v in variants:
        keys = sorted(k for k in runs if k[0] == v)
        cells = []
        for m in metrics:
            mu, sd = mean_std([runs[k][m] for k in keys])
            cells.append(f"{mu:.2f} ± {sd:.2f}" if m != "loss" else f"{mu:.4f} ± {sd:.4f}")
        print(f"| {v} | {len(keys)} | " + " | ".join(cells) + " |")
    print()
    print("| variant | paired seeds | " + " | ".join("Δ " + names[m] + " [95% CI]" for m in metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for v in variants:
        if v == "none":
            continue
        pairs = [(k, ("none", k[1], k[2])) for k in runs if k[0] == v and ("none", k[1], k[2]) in runs]
        cells = []
        for m in metrics:
            d = [runs[a][m] - runs[b][m] for a, b in pairs]
            mu = statistics.mean(d)
            if len(d) > 1:
                half = T975.get(len(d) - 1, 1.96) * statistics.stdev(d) / math.sqrt(len(d))
                cells.append(f"{mu:+.2f} [{mu - half:+.2f}, {mu + half:+.2f}]" if m != "loss"
                             else f"{mu:+.4f} [{mu - half:+.4f}, {mu + half:+.4f}]")
            else:
                cells.append(f"{mu:+.2f} [n/a]")
        print(f"| {v} | {len(pairs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
