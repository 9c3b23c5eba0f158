#!/usr/bin/env python3
"""The tables of the full-recipe Multi30k study (docs/results/multi30k-full) from its sweep
directories, after scripts/multi30k-full-eval.sh has scored every finished run.

Per run: test2016 BLEU-4 and chrF of the average of the last 10 checkpoints (beam 5, lowercased
tokenised, --tokenize none), the same of the last checkpoint alone, the averaged model's output
detokenised and scored by sacreBLEU's default (13a) against the raw reference case-insensitively,
the averaged model's test loss,
the largest attention logit over the run's training records, and its training time. Per variant:
mean ± sample standard deviation over seeds; against `none`, the paired difference (same seed:
same initial weights shared, same batches) with a two-sided 95% t interval, df = n - 1, the
statistics of `ember report`.

    scripts/multi30k-full-report.py SWEEP_DIR [SWEEP_DIR ...] [--markdown]
"""
import argparse
import json
import math
import re
import statistics
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
ORDER = ["none", "layernorm", "rmsnorm", "l2"]
METRICS = [
    ("bleu", "test BLEU (avg. last 10)", 2),
    ("chrf", "test chrF (avg. last 10)", 2),
    ("bleu_last", "test BLEU (last ckpt)", 2),
    ("bleu_detok", "test sacreBLEU, detok., case-insens. (avg. last 10)", 2),
    ("loss", "test loss (avg. last 10)", 4),
    ("max_logit", "max attn logit", 1),
]


def run_row(d: Path):
    files = {t: d / f"test-{t}.bleu.json" for t in ("avg10", "last")}
    if not all(f.is_file() for f in files.values()):
        return None
    avg = json.loads(files["avg10"].read_text())
    last = json.loads(files["last"].read_text())
    ev = json.loads((d / "test-avg10.eval.json").read_text())
    detok = d / "test-avg10.detok.bleu.json"
    bleu_detok = json.loads(detok.read_text())["bleu"]["score"] if detok.is_file() else float("nan")
    summary = json.loads((d / "summary.json").read_text())
    logits = []
    for line in (d / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "train" and r.get("attn_max_logit"):
            logits.append(max(r["attn_max_logit"]))
    return {
        "bleu": avg["bleu"]["score"],
        "chrf": avg["chrf"]["score"],
        "bleu_last": last["bleu"]["score"],
        "bleu_detok": bleu_detok,
        "loss": ev["loss"],
        "max_logit": max(logits) if logits else float("nan"),
        "train_h": summary.get("train_secs", float("nan")) / 3600,
        "wall_h": summary.get("wall_secs", float("nan")) / 3600,
    }


def paired(runs, variant, metric):
    """Differences variant − none on the seeds both finished: (mean, half-width or None, n)."""
    d = [runs[k][metric] - runs[("none", k[1], k[2])][metric]
         for k in sorted(runs) if k[0] == variant and ("none", k[1], k[2]) in runs]
    if not d:
        return None
    half = T975.get(len(d) - 1, 1.96) * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None
    return statistics.mean(d), half, len(d)


def reference_table(runs, variants):
    """The published figures this study is read against, beside its own."""
    def mean(v, m, digits=2):
        xs = [r[m] for k, r in runs.items() if k[0] == v]
        return f"{statistics.mean(xs):.{digits}f}" if xs else "–"

    def delta(v, m, digits):
        p = paired(runs, v, m)
        if p is None:
            return "–"
        mu, half, n = p
        ci = f" [{mu - half:+.{digits}f}, {mu + half:+.{digits}f}]" if half is not None else ""
        return f"{mu:+.{digits}f}{ci} (n = {n})"

    print("| source | task, model | baseline | QK-norm | Δ |")
    print("|---|---|---|---|---|")
    print("| the seed's table | translation | BLEU 28.5, loss 1.2 | LayerNorm: BLEU 29.2, loss 1.1 | +0.7 BLEU, −0.1 loss |")
    print("| Henry et al. 2020 (QKNorm) | 5 low-resource translation pairs | | L2 + learned g | +0.93 BLEU (average) |")
    print("| Wu et al. 2021 (fairseq) | Multi30k En→De test2016, Transformer-Tiny | BLEU 41.02 | | |")
    for v in variants:
        if v == "none":
            continue
        print(f"| Ember, this study | Multi30k En→De test2016, Transformer-Tiny | BLEU {mean('none', 'bleu')}, "
              f"loss {mean('none', 'loss', 3)} | {v}: BLEU {mean(v, 'bleu')}, loss {mean(v, 'loss', 3)} | "
              f"{delta(v, 'bleu', 2)} BLEU, {delta(v, 'loss', 3)} loss |")


def fmt(x, digits):
    return f"{x:.{digits}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    args = ap.parse_args()
    runs = {}
    for sweep in args.sweeps:
        for d in sorted(Path(sweep, "runs").iterdir()):
            m = re.fullmatch(r"(\w+)-lr(.+)-seed(\d+)", d.name)
            row = run_row(d) if m else None
            if row:
                runs[(m[1], m[2], int(m[3]))] = row
    variants = sorted({v for v, _, _ in runs}, key=lambda v: ORDER.index(v) if v in ORDER else 99)
    print("| variant | seeds | " + " | ".join(name for _, name, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for v in variants:
        keys = sorted(k for k in runs if k[0] == v)
        cells = []
        for m, _, digits in METRICS:
            xs = [runs[k][m] for k in keys]
            # One seed has no spread to show: its value alone, not "± 0".
            sd = f" ± {fmt(statistics.stdev(xs), digits)}" if len(xs) > 1 else ""
            cells.append(f"{fmt(statistics.mean(xs), digits)}{sd}")
        print(f"| {v} | {len(keys)} | " + " | ".join(cells) + " |")
    print()
    print("| variant | paired seeds | " + " | ".join(f"Δ {name} [95% CI]" for _, name, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for v in variants:
        if v == "none":
            continue
        cells, n = [], 0
        for m, _, digits in METRICS:
            p = paired(runs, v, m)
            if p is None:
                break
            mu, half, n = p
            if half is None:
                cells.append(f"{mu:+.{digits}f} (n = 1)")
            else:
                cells.append(f"{mu:+.{digits}f} [{mu - half:+.{digits}f}, {mu + half:+.{digits}f}]")
        if not cells:
            continue
        print(f"| {v} | {n} | " + " | ".join(cells) + " |")
    print()
    reference_table(runs, variants)
    print()
    print("| run | test BLEU avg10 | last | detok. | chrF | test loss | max logit | training h | wall h |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in sorted(runs, key=lambda k: (k[2], ORDER.index(k[0]) if k[0] in ORDER else 99)):
        r = runs[k]
        print(f"| {k[0]}-lr{k[1]}-seed{k[2]} | {r['bleu']:.2f} | {r['bleu_last']:.2f} | {r['bleu_detok']:.2f} | {r['chrf']:.2f} | "
              f"{r['loss']:.4f} | {r['max_logit']:.1f} | {r['train_h']:.2f} | {r['wall_h']:.2f} |")


if __name__ == "__main__":
    main()
