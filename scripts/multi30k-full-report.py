#!/usr/bin/env python3
"""The tables of the Multi30k study (docs/results/multi30k-full) from its sweep directories,
after scripts/multi30k-full-eval.sh has scored every finished run under the validation-only
protocol (the study README's "Protocol").

Per run: the final model and length penalty chosen on validation, the validation BLEU that chose
them, and test2016 scored once with them: BLEU-4 (lowercased tokenised, --tokenize none), its
brevity penalty (BP), BLEU without the BP (the geometric mean of the n-gram precisions), the
hypothesis/reference length ratio, chrF, the detokenised sacreBLEU (13a, case-insensitive), the
test loss; and the largest attention logit over the run's training records.

Per variant: mean ± sample sd over seeds. Against `none`, per metric: the mean paired
difference (same seed: same initial weights where shapes agree, same batches) with its two-sided
95% t interval (df = n − 1), the paired t test's p, the Holm-adjusted p over the family of
comparisons with `none` in the table (each metric its own family), the Bonferroni-corrected
simultaneous interval, and the power the paired t test had (α = 0.05, two-sided, at the observed
sd of the differences) to detect the published effect it is read against: the seed's +0.7 BLEU
and −0.1 loss for every QK-norm variant, Henry et al.'s +0.93 BLEU for l2 too.

A sweep over several peak learning rates (part c) gets, instead, the tables per variant and
learning rate and each variant's LR sensitivity (Wortsman et al. 2023, with BLEU for the loss): per
seed, the mean over the rates of BLEU(η*) − BLEU(η), where η* is the rate with the seed's best
*validation* BLEU and the BLEUs are test BLEUs; a diverged run counts as BLEU 0 on both. Its
paired difference from `none` gets the t interval, p and Holm adjustment over the variants; then,
as a secondary table, test BLEU against `none` at each rate, Holm-adjusted over every variant ×
rate pair.

Needs scipy (t quantiles, p values, the non-central t of the power):

    scripts/multi30k-full-report.py SWEEP_DIR [SWEEP_DIR ...]
"""
import argparse
import json
import math
import re
import statistics
from pathlib import Path

from scipy import stats

ORDER = ["none", "layernorm", "rmsnorm", "l2"]
NAN = float("nan")
# The published effects each comparison is read against: (metric, effect, source).
PUBLISHED = {
    "bleu": [(0.7, "the seed's +0.7")],
    "loss": [(-0.1, "the seed's −0.1")],
}
HENRY = (0.93, "Henry et al.'s +0.93")
# (key, column name, digits) of the per-variant and paired tables.
METRICS = [
    ("bleu", "test BLEU", 2),
    ("bp", "BP", 3),
    ("bleu_nobp", "BLEU without BP", 2),
    ("ratio", "hyp/ref length", 3),
    ("chrf", "chrF", 2),
    ("bleu_detok", "sacreBLEU detok.", 2),
    ("loss", "test loss", 4),
    ("max_logit", "max attn logit", 1),
]


def load(path):
    return json.loads(Path(path).read_text())


def run_row(d: Path):
    """One run's figures; None while it is unscored (and has not diverged)."""
    summary = load(d / "summary.json") if (d / "summary.json").is_file() else {}
    if summary.get("diverged"):
        return {"diverged": True, "bleu": 0.0, "valid_bleu": 0.0}
    if not (d / "test.bleu.json").is_file():
        return None
    sel = load(d / "selection.json")
    b = load(d / "test.bleu.json")["bleu"]
    logits = []
    for line in (d / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "train" and r.get("attn_max_logit"):
            logits.append(max(r["attn_max_logit"]))
    return {
        "model": sel["model"],
        "penalty": sel["length_penalty"],
        "valid_bleu": sel["valid_bleu"],
        "bleu": b["score"],
        "bp": b["bp"],
        "bleu_nobp": b["score"] / b["bp"],
        "ratio": b["ratio"],
        "chrf": load(d / "test.bleu.json")["chrf"]["score"],
        "bleu_detok": load(d / "test.detok.bleu.json")["bleu"]["score"],
        "loss": load(d / "test.eval.json")["loss"],
        "max_logit": max(logits) if logits else NAN,
        "train_h": summary.get("train_secs", NAN) / 3600,
        "diverged": False,
    }


def fmt(x, digits):
    return "–" if math.isnan(x) else f"{x:.{digits}f}"


def mean_sd(xs, digits):
    """Mean ± sample sd; one value alone (no "± 0"); "–" when a value is missing."""
    if not xs or any(math.isnan(x) for x in xs):
        return "–"
    sd = f" ± {fmt(statistics.stdev(xs), digits)}" if len(xs) > 1 else ""
    return f"{fmt(statistics.mean(xs), digits)}{sd}"


def paired(runs, variant, metric, lr=None):
    """Differences variant − none on the seeds both have."""
    return [runs[k][metric] - runs[("none", k[1], k[2])][metric]
            for k in sorted(runs, key=lambda k: k[2])
            if k[0] == variant and (lr is None or k[1] == lr) and ("none", k[1], k[2]) in runs]


def t_test(d, level=0.95):
    """Mean, the two-sided `level` t interval and the paired t test's p, of differences `d`."""
    mu = statistics.mean(d)
    if len(d) < 2:
        return mu, NAN, NAN, NAN
    se = statistics.stdev(d) / math.sqrt(len(d))
    if se == 0:
        return mu, mu, mu, 0.0 if mu else 1.0
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * se
    p = 2 * stats.t.sf(abs(mu / se), len(d) - 1)
    return mu, mu - half, mu + half, p


def power(d, effect, alpha=0.05):
    """The paired t test's power to detect a true mean difference `effect` at the sd of `d`."""
    n = len(d)
    if n < 2 or statistics.stdev(d) == 0:
        return NAN
    df, nc = n - 1, effect / (statistics.stdev(d) / math.sqrt(n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)


def holm(ps):
    """Holm's step-down adjusted p values, in the order given. A p that cannot be computed (one
    seed) stays unknown, and still counts in the family size of the others."""
    order = sorted((i for i in range(len(ps)) if not math.isnan(ps[i])), key=lambda i: ps[i])
    adjusted, running = [NAN] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def signed(x, digits):
    return "–" if math.isnan(x) else f"{x:+.{digits}f}"


def comparison_tables(runs, variants, lr=None):
    """Per metric: each variant vs none, with the Holm correction over the variants."""
    others = [v for v in variants if v != "none" and paired(runs, v, "bleu", lr)]
    if not others:
        return
    m = len(others)
    level = 1 - 0.05 / m
    print(f"Paired differences vs `none` (variant − none, same seed), per metric: mean with its 95% t "
          f"interval; the paired t test's p and its Holm adjustment over the {m} comparison{'s' * (m > 1)} "
          f"with `none`; the Bonferroni-corrected simultaneous {100 * level:.1f}% interval.")
    print()
    print("| metric | variant | seeds | Δ [95% CI] | p | Holm p | Δ [Bonferroni CI] |")
    print("|---|---|---|---|---|---|---|")
    for key, name, digits in METRICS:
        rows = [(v, paired(runs, v, key, lr)) for v in others]
        tests = [t_test(d) for _, d in rows]
        adjusted = holm([t[3] for t in tests])
        for (v, d), (mu, lo, hi, p), hp in zip(rows, tests, adjusted):
            _, blo, bhi, _ = t_test(d, level)
            print(f"| {name} | {v} | {len(d)} | {signed(mu, digits)} [{signed(lo, digits)}, {signed(hi, digits)}] | "
                  f"{fmt(p, 3)} | {fmt(hp, 3)} | [{signed(blo, digits)}, {signed(bhi, digits)}] |")
    print()
    print("Power of the paired t test (two-sided, α = 0.05, at each comparison's observed sd of the "
          "differences) to detect the published effect it is read against, and the seeds a 95% "
          "interval at that sd would need to exclude zero at the observed mean:")
    print()
    print("| variant | metric | seeds | sd of Δ | published effect | power | seeds to exclude 0 at the observed mean |")
    print("|---|---|---|---|---|---|---|")
    for v in others:
        for key in ("bleu", "loss"):
            d = paired(runs, v, key, lr)
            targets = PUBLISHED[key] + ([HENRY] if v == "l2" and key == "bleu" else [])
            sd = statistics.stdev(d) if len(d) > 1 else NAN
            for effect, source in targets:
                print(f"| {v} | {key} | {len(d)} | {fmt(sd, 4 if key == 'loss' else 2)} | {source} | "
                      f"{fmt(power(d, effect), 2)} | {seeds_needed(d)} |")
    print()


def seeds_needed(d):
    """Smallest n whose 95% t interval half-width at sd(d) is below |mean(d)| (t arithmetic)."""
    if len(d) < 2 or statistics.stdev(d) == 0:
        return "–"
    mu, sd = abs(statistics.mean(d)), statistics.stdev(d)
    for n in range(2, 1001):
        if stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) < mu:
            return str(n)
    return "> 1000"


def variant_table(runs, variants, lr=None):
    print("Test2016, mean ± sample sd over seeds (each run's final model and length penalty chosen "
          "on validation, test scored once):")
    print()
    print("| variant | seeds | " + " | ".join(name for _, name, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for v in variants:
        keys = sorted(k for k in runs if k[0] == v and (lr is None or k[1] == lr))
        cells = [mean_sd([runs[k][m] for k in keys], digits) for m, _, digits in METRICS]
        print(f"| {v} | {len(keys)} | " + " | ".join(cells) + " |")
    print()


def reference_table(runs, variants):
    """The published figures this study is read against, beside its own."""
    def mean(v, m, digits):
        xs = [r[m] for k, r in runs.items() if k[0] == v]
        return f"{statistics.mean(xs):.{digits}f}" if xs else "–"

    def delta(v, m, digits):
        d = paired(runs, v, m)
        mu, lo, hi, _ = t_test(d)
        return f"{signed(mu, digits)} [{signed(lo, digits)}, {signed(hi, digits)}] (n = {len(d)})"

    print("| source | task, model | baseline | QK-norm | Δ |")
    print("|---|---|---|---|---|")
    print("| the seed's table | translation | BLEU 28.5, loss 1.2 | LayerNorm: BLEU 29.2, loss 1.1 | +0.7 BLEU, −0.1 loss |")
    print("| Henry et al. 2020 (QKNorm) | 5 low-resource translation pairs | | L2 + learned g | +0.93 BLEU (average) |")
    print("| Wu et al. 2021 (fairseq) | Multi30k En→De test2016, Transformer-Tiny (post-norm) | BLEU 41.02 | | |")
    for v in variants:
        if v == "none" or not paired(runs, v, "bleu"):
            continue
        print(f"| Ember, this study | Multi30k En→De test2016, this sweep's model | BLEU {mean('none', 'bleu', 2)}, "
              f"loss {mean('none', 'loss', 3)} | {v}: BLEU {mean(v, 'bleu', 2)}, loss {mean(v, 'loss', 3)} | "
              f"{delta(v, 'bleu', 2)} BLEU, {delta(v, 'loss', 3)} loss |")
    print()


def choices_table(runs):
    """What validation chose, per variant: how often each model and each penalty."""
    print("What validation chose (final model: `last` checkpoint, average of the last 5 or 10; "
          "length penalty: GNMT's α or fairseq's lenpen), runs per choice:")
    print()
    print("| variant | final model | length penalty |")
    print("|---|---|---|")
    for v in sorted({k[0] for k in runs}, key=ORDER.index):
        rows = [r for k, r in runs.items() if k[0] == v and not r["diverged"]]
        count = lambda key: ", ".join(f"{c} × {n}" for c, n in sorted(
            {r[key]: sum(x[key] == r[key] for x in rows) for r in rows}.items()))
        print(f"| {v} | {count('model')} | {count('penalty')} |")
    print()


def lr_sweep_tables(runs, variants, lrs):
    """Part (c): test figures per variant and rate, and the LR sensitivity."""
    seeds = sorted({k[2] for k in runs})
    print("Test set per variant and peak learning rate, mean ± sample sd over seeds (a diverged run "
          "counts as BLEU 0; the loss is over the runs that did not diverge):")
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
    sens, best_lr = {}, {}
    for v in variants:
        for s in seeds:
            rows = {lr: runs[(v, lr, s)] for lr in lrs if (v, lr, s) in runs}
            if len(rows) == len(lrs):
                star = max(lrs, key=lambda lr: (rows[lr]["valid_bleu"], -lrs.index(lr)))
                best_lr[(v, s)] = star
                sens[(v, s)] = statistics.mean(rows[star]["bleu"] - rows[lr]["bleu"] for lr in lrs)
    print("LR sensitivity (per seed: the mean over the rates of test BLEU at the rate with the seed's "
          "best validation BLEU minus test BLEU at each rate; lower is more robust), and the paired "
          "Δ vs `none`:")
    print()
    print("| variant | seeds | LR sensitivity (test BLEU) | per seed | Δ vs none [95% CI] | p | Holm p | best lr by validation, per seed |")
    print("|---|---|---|---|---|---|---|---|")
    others = [v for v in variants if v != "none"]
    diffs = {v: [sens[(v, s)] - sens[("none", s)] for s in seeds if (v, s) in sens and ("none", s) in sens]
             for v in others}
    tests = {v: t_test(d) if d else (NAN, NAN, NAN, NAN) for v, d in diffs.items()}
    adjusted = dict(zip(others, holm([tests[v][3] for v in others])))
    for v in variants:
        mine = [s for s in seeds if (v, s) in sens]
        if not mine:
            continue
        delta, p, hp = "", "", ""
        if v != "none" and diffs[v]:
            mu, lo, hi, pv = tests[v]
            delta = f"{signed(mu, 2)} [{signed(lo, 2)}, {signed(hi, 2)}]"
            p, hp = fmt(pv, 3), fmt(adjusted[v], 3)
        each = ", ".join(fmt(sens[(v, s)], 2) for s in mine)
        chosen = ", ".join(f"seed {s}: {best_lr[(v, s)]}" for s in mine)
        print(f"| {v} | {len(mine)} | {mean_sd([sens[(v, s)] for s in mine], 2)} | {each} | {delta} | {p} | {hp} | {chosen} |")
    print()
    per_rate_table(runs, others, lrs)


def per_rate_table(runs, others, lrs):
    """Secondary to the LR sensitivity: test BLEU vs none at each rate, Holm over every pair."""
    cells = [(v, lr, paired(runs, v, "bleu", lr)) for v in others for lr in lrs]
    cells = [c for c in cells if c[2]]
    if not cells:
        return
    tests = [t_test(d) for _, _, d in cells]
    adjusted = holm([t[3] for t in tests])
    print(f"Secondary, per rate: test BLEU vs `none` (variant − none, same seed; a diverged run counts "
          f"as BLEU 0), with the paired t test's p and its Holm adjustment over all {len(cells)} "
          f"variant × rate comparisons:")
    print()
    print("| variant | lr | seeds | Δ test BLEU [95% CI] | p | Holm p |")
    print("|---|---|---|---|---|---|")
    for (v, lr, d), (mu, lo, hi, p), hp in zip(cells, tests, adjusted):
        print(f"| {v} | {lr} | {len(d)} | {signed(mu, 2)} [{signed(lo, 2)}, {signed(hi, 2)}] | {fmt(p, 3)} | {fmt(hp, 3)} |")
    print()


def every_run_table(runs):
    print("Every run (validation chose the final model and penalty; test scored once):")
    print()
    print("| run | final model | length penalty | valid BLEU | test BLEU | BP | BLEU w/o BP | "
          "length ratio | chrF | detok. | test loss | max logit | training h |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(runs, key=lambda k: (k[2], ORDER.index(k[0]) if k[0] in ORDER else 99, float(k[1]))):
        r = runs[k]
        name = f"{k[0]}-lr{k[1]}-seed{k[2]}"
        if r["diverged"]:
            print(f"| {name} | diverged |" + " |" * 11)
            continue
        print(f"| {name} | {r['model']} | {r['penalty']} | {fmt(r['valid_bleu'], 2)} | {fmt(r['bleu'], 2)} | "
              f"{fmt(r['bp'], 3)} | {fmt(r['bleu_nobp'], 2)} | {fmt(r['ratio'], 3)} | {fmt(r['chrf'], 2)} | "
              f"{fmt(r['bleu_detok'], 2)} | {fmt(r['loss'], 4)} | {fmt(r['max_logit'], 1)} | {fmt(r['train_h'], 2)} |")


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
    variant_table(runs, variants)
    comparison_tables(runs, variants)
    reference_table(runs, variants)
    choices_table(runs)
    every_run_table(runs)


if __name__ == "__main__":
    main()
