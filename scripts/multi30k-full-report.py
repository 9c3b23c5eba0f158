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

A sweep over several peak learning rates (part c, configs/multi30k-tiny-lc-lr.yaml) gets, instead,
the tables per variant and learning rate, and each variant's LR sensitivity in test BLEU: Wortsman
et al.'s (2023) measure with BLEU for the loss, i.e. per seed the mean over the swept learning rates
of BLEU* − BLEU(η), BLEU* the seed's best; a run that diverged counts as BLEU 0 (the analogue of
their capping at the initial loss).

    scripts/multi30k-full-report.py SWEEP_DIR [SWEEP_DIR ...]
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


NAN = float("nan")


def run_row(d: Path):
    """One run's figures; None while it has no averaged-checkpoint score (and has not diverged)."""
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    if summary.get("diverged"):
        return {"diverged": True, "bleu": 0.0}
    avg_file = d / "test-avg10.bleu.json"
    if not avg_file.is_file():
        return None
    avg = json.loads(avg_file.read_text())
    last_file = d / "test-last.bleu.json"
    bleu_last = json.loads(last_file.read_text())["bleu"]["score"] if last_file.is_file() else NAN
    ev = json.loads((d / "test-avg10.eval.json").read_text())
    detok = d / "test-avg10.detok.bleu.json"
    bleu_detok = json.loads(detok.read_text())["bleu"]["score"] if detok.is_file() else NAN
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
        "bleu_last": bleu_last,
        "bleu_detok": bleu_detok,
        "loss": ev["loss"],
        "max_logit": max(logits) if logits else float("nan"),
        "train_h": summary.get("train_secs", NAN) / 3600,
        "wall_h": summary.get("wall_secs", NAN) / 3600,
        "diverged": False,
    }


def paired(runs, variant, metric):
    """Differences variant − none on the seeds both finished (empty when none are)."""
    return [runs[k][metric] - runs[("none", k[1], k[2])][metric]
            for k in sorted(runs) if k[0] == variant and ("none", k[1], k[2]) in runs]


def reference_table(runs, variants):
    """The published figures this study is read against, beside its own."""
    def mean(v, m, digits=2):
        xs = [r[m] for k, r in runs.items() if k[0] == v]
        return f"{statistics.mean(xs):.{digits}f}" if xs else "–"

    def delta(v, m, digits):
        d = paired(runs, v, m)
        if not d:
            return "–"
        return t_interval(d, digits) + (f" (n = {len(d)})" if len(d) > 1 else "")

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
    return "–" if math.isnan(x) else f"{x:.{digits}f}"


def mean_sd(xs, digits):
    """Mean ± sample sd; one value alone (no "± 0"); "–" when a value is missing."""
    if any(math.isnan(x) for x in xs):
        return "–"
    sd = f" ± {fmt(statistics.stdev(xs), digits)}" if len(xs) > 1 else ""
    return f"{fmt(statistics.mean(xs), digits)}{sd}"


def t_interval(d, digits):
    """Mean of the differences `d` with its two-sided 95% t interval, as a table cell."""
    mu = statistics.mean(d)
    if len(d) < 2:
        return f"{mu:+.{digits}f} (n = 1)"
    half = T975.get(len(d) - 1, 1.96) * statistics.stdev(d) / math.sqrt(len(d))
    return f"{mu:+.{digits}f} [{mu - half:+.{digits}f}, {mu + half:+.{digits}f}]"


def lr_sweep_tables(runs, variants, lrs):
    """Part (c): test figures per variant and learning rate, and the LR sensitivity in test BLEU."""
    seeds = sorted({k[2] for k in runs})
    print("Test set per variant and peak learning rate, mean ± sample sd over seeds (a diverged run counts as BLEU 0; the loss is over the runs that did not diverge):")
    print()
    print("| variant | " + " | ".join(f"lr {lr}: BLEU" for lr in lrs) + " | "
          + " | ".join(f"lr {lr}: loss" for lr in lrs) + " |")
    print("|---|" + "---|" * (2 * len(lrs)))
    for v in variants:
        bleu, loss = [], []
        for lr in lrs:
            rows = [runs[(v, lr, s)] for s in seeds if (v, lr, s) in runs]
            div = sum(r["diverged"] for r in rows)
            note = f" ({div} diverged)" if div else ""
            bleu.append((mean_sd([r["bleu"] for r in rows], 2) if rows else "–") + note)
            ok = [r["loss"] for r in rows if not r["diverged"]]
            loss.append(mean_sd(ok, 4) if ok else "–")
        print(f"| {v} | " + " | ".join(bleu) + " | " + " | ".join(loss) + " |")
    print()
    # Per seed: only seeds with a result at every learning rate give a sensitivity.
    sens = {}
    for v in variants:
        for s in seeds:
            xs = [runs[(v, lr, s)]["bleu"] for lr in lrs if (v, lr, s) in runs]
            if len(xs) == len(lrs):
                sens[(v, s)] = statistics.mean(max(xs) - x for x in xs)
    print("LR sensitivity in test BLEU (per seed, the mean over the learning rates of the seed's best "
          "BLEU minus the BLEU at that rate; lower is more robust), and the paired Δ vs `none`:")
    print()
    print("| variant | seeds | LR sensitivity (BLEU) | Δ vs none [95% CI] | best lr (mean BLEU) |")
    print("|---|---|---|---|---|")
    for v in variants:
        mine = [s for s in seeds if (v, s) in sens]
        if not mine:
            continue
        pairs = [sens[(v, s)] - sens[("none", s)] for s in mine if ("none", s) in sens]
        delta = "" if v == "none" or not pairs else t_interval(pairs, 2)
        by_lr = {lr: [runs[(v, lr, s)]["bleu"] for s in seeds if (v, lr, s) in runs] for lr in lrs}
        best = max((lr for lr in lrs if by_lr[lr]), key=lambda lr: statistics.mean(by_lr[lr]))
        print(f"| {v} | {len(mine)} | {mean_sd([sens[(v, s)] for s in mine], 2)} | {delta} | "
              f"{best} ({statistics.mean(by_lr[best]):.2f}) |")
    print()


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
    lrs = sorted({lr for _, lr, _ in runs}, key=float)
    if len(lrs) > 1:
        lr_sweep_tables(runs, variants, lrs)
        every_run_table(runs)
        return
    runs = {k: r for k, r in runs.items() if not r["diverged"]}
    print("| variant | seeds | " + " | ".join(name for _, name, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for v in variants:
        keys = sorted(k for k in runs if k[0] == v)
        # One seed has no spread to show: its value alone, not "± 0".
        cells = [mean_sd([runs[k][m] for k in keys], digits) for m, _, digits in METRICS]
        print(f"| {v} | {len(keys)} | " + " | ".join(cells) + " |")
    print()
    print("| variant | paired seeds | " + " | ".join(f"Δ {name} [95% CI]" for _, name, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for v in variants:
        if v == "none":
            continue
        n = len(paired(runs, v, "bleu"))
        if not n:
            continue
        cells = [t_interval(paired(runs, v, m), digits) for m, _, digits in METRICS]
        print(f"| {v} | {n} | " + " | ".join(cells) + " |")
    print()
    reference_table(runs, variants)
    print()
    every_run_table(runs)


def every_run_table(runs):
    print("| run | test BLEU avg10 | last | detok. | chrF | test loss | max logit | training h | wall h |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in sorted(runs, key=lambda k: (k[2], ORDER.index(k[0]) if k[0] in ORDER else 99, float(k[1]))):
        r = runs[k]
        name = f"{k[0]}-lr{k[1]}-seed{k[2]}"
        if r["diverged"]:
            print(f"| {name} | diverged |  |  |  |  |  |  |  |")
            continue
        print(f"| {name} | {fmt(r['bleu'], 2)} | {fmt(r['bleu_last'], 2)} | {fmt(r['bleu_detok'], 2)} | {fmt(r['chrf'], 2)} | "
              f"{fmt(r['loss'], 4)} | {fmt(r['max_logit'], 1)} | {fmt(r['train_h'], 2)} | {fmt(r['wall_h'], 2)} |")


if __name__ == "__main__":
    main()
