"""The bookkeeping of scripts/bench-vs-nanogpt.sh: one JSON line per timed run, a table row per
pair, and the summary over pairs, all from the same JSONL file (--out).

    python scripts/bench_vs_nanogpt.py record OUT IMPL PAIR THREADS PRECISION SHAPE DATA [KEY=VALUE ...]
    python scripts/bench_vs_nanogpt.py header PRECISIONS
    python scripts/bench_vs_nanogpt.py pair OUT PAIR THREADS PRECISIONS
    python scripts/bench_vs_nanogpt.py summary OUT PRECISIONS

IMPL is ember (DATA: `ember bench --json`'s report, whose `precision` must be PRECISION) or
nanogpt (DATA: its timed iterations' ms, space-separated). Each KEY=VALUE is added to the record
as a string (the Ember binary, the torch version, nanoGPT's commit). PRECISIONS is a comma-separated list (f32,bf16),
in the order each pair ran them. A run's record holds the median and p10 of its own steps; the
summary takes, per side, the median over pairs of those medians, with their range as the spread,
and per pair the ratios nanoGPT ms ÷ Ember ms (above 1: Ember faster) and, when both
precisions ran, each side's bf16 speed-up (f32 ms ÷ bf16 ms) and each side's faster precision
against the other's (nanoGPT's faster ms ÷ Ember's faster ms, per pair). A precision with no
Ember records was refused by Ember (a CPU without AVX512_BF16): its rows say so and it counts
for nanoGPT alone. The summary is printed and appended to OUT as `{"summary": ...}` lines after
the run records.
"""

import json
import statistics
import sys

IMPLS = ("ember", "nanogpt")
REFUSED = "refused by Ember"
NAMES = {"ember": "Ember", "nanogpt": "nanoGPT"}


def p10(ms: list[float]) -> float:
    ms = sorted(ms)
    return ms[int(0.1 * (len(ms) - 1))]


def record(out, impl, pair, threads, precision, shape, data, *info):
    if impl == "ember":
        r = json.loads(data)
        # A binary from before train.precision reports none: it can only have run f32.
        ran = r.get("precision", "f32")
        if ran != precision:
            sys.exit(f"bench-vs-nanogpt: error: Ember was asked for {precision} and ran {ran}")
        med, low = r["ms_per_step_median"], r["ms_per_step_p10"]
        extra = {"products": r["products"]} if "products" in r else {}
    else:
        ms = [float(x) for x in data.split()]
        med, low, extra = statistics.median(ms), p10(ms), {"iterations": len(ms)}
    line = dict(impl=impl, pair=int(pair), threads=threads, precision=precision, shape=shape,
                ms_median=med, ms_p10=low, loadavg=open("/proc/loadavg").read().split()[:3],
                **extra, **dict(kv.split("=", 1) for kv in info))
    with open(out, "a") as f:
        print(json.dumps(line), file=f)


def runs(out):
    with open(out) as f:
        return [r for r in map(json.loads, f) if "impl" in r and "summary" not in r]


def lookup(rs, impl, pair, threads, precision):
    """The record of one run, or None."""
    return next((r for r in rs if (r["impl"], r["pair"], r["threads"], r["precision"])
                 == (impl, pair, threads, precision)), None)


def header(precisions):
    cols = [f"{'threads':<8} {'pair':<5}"]
    for p in precisions:
        cols += [f"{'Ember ' + p + ' ms (p10)':>22}", f"{'nanoGPT ' + p + ' ms (p10)':>24}",
                 f"{'N÷E ' + p:>9}"]
    if len(precisions) == 2:
        cols += [f"{'Ember bf16×':>12}", f"{'nanoGPT bf16×':>14}"]
    print(" ".join(cols))


def pair_row(out, pair, threads, precisions):
    rs, pair = runs(out), int(pair)
    side = {(impl, p): lookup(rs, impl, pair, threads, p) for impl in IMPLS for p in precisions}
    cols = [f"{threads:<8} {pair:<5}"]
    for p in precisions:
        e, n = side["ember", p], side["nanogpt", p]
        cols += [f"{e['ms_median']:>14.1f} ({e['ms_p10']:>6.1f})" if e else f"{REFUSED:>22}",
                 f"{n['ms_median']:>16.1f} ({n['ms_p10']:>6.1f})",
                 f"{n['ms_median'] / e['ms_median']:>9.2f}" if e else f"{'–':>9}"]
    if len(precisions) == 2:
        for impl, width in (("ember", 12), ("nanogpt", 14)):
            f32, bf16 = side[impl, "f32"], side[impl, "bf16"]
            cols.append(f"{f32['ms_median'] / bf16['ms_median']:>{width}.2f}" if bf16 else f"{'–':>{width}}")
    print(" ".join(cols))


def spread(values):
    return dict(median=statistics.median(values), min=min(values), max=max(values),
                pairs=len(values))


def shown(s, digits):
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def fastest_against_fastest(complete, shape, threads):
    """Per pair, each side in whichever precision ran faster: nanoGPT's ms ÷ Ember's ms."""
    ran = {impl: [by[impl] for by in complete.values() if by[impl]] for impl in IMPLS}
    pairs = sorted(set.intersection(*(set(runs) for impl in IMPLS for runs in ran[impl])))
    faster = {impl: [min((runs[q] for runs in ran[impl]), key=lambda r: r["ms_median"])
                     for q in pairs] for impl in IMPLS}
    s = spread([n["ms_median"] / e["ms_median"] for e, n in zip(faster["ember"], faster["nanogpt"])])
    chosen = {impl: sorted({r["precision"] for r in faster[impl]}) for impl in IMPLS}
    print(f"\nthreads {threads}: each side's faster precision (Ember {'/'.join(chosen['ember'])}, "
          f"nanoGPT {'/'.join(chosen['nanogpt'])}), nanoGPT ms ÷ Ember ms per pair: "
          f"**{shown(s, 2)}**, {len(pairs)} pairs")
    return dict(summary="fastest_against_fastest", shape=shape, threads=threads,
                ember_precisions=chosen["ember"], nanogpt_precisions=chosen["nanogpt"], **s)


def summary(out, precisions):
    rs = runs(out)
    shape = rs[0]["shape"]
    lines = []
    print(f"\nshape {shape}; ms per step: median over pairs of each run's median (range over pairs); "
          "ratio nanoGPT ÷ Ember per pair (above 1: Ember faster)")
    print("threads | precision | Ember ms/step | nanoGPT ms/step | nanoGPT ÷ Ember | pairs")
    print("---|---|---|---|---|---")
    for t in dict.fromkeys(r["threads"] for r in rs):
        complete = {}
        for p in precisions:
            by = {impl: {r["pair"]: r for r in rs
                         if (r["impl"], r["threads"], r["precision"]) == (impl, t, p)}
                  for impl in IMPLS}
            complete[p] = by
            if not by["ember"]:
                ms = spread([r["ms_median"] for r in by["nanogpt"].values()])
                print(f"{t} | {p} | {REFUSED} | {shown(ms, 1)} | – | {len(by['nanogpt'])}")
                lines.append(dict(summary="ember_refused", shape=shape, threads=t, precision=p,
                                  nanogpt_ms=ms))
                continue
            pairs = sorted(set(by["ember"]) & set(by["nanogpt"]))
            ms = {impl: spread([by[impl][q]["ms_median"] for q in pairs]) for impl in IMPLS}
            ratio = spread([by["nanogpt"][q]["ms_median"] / by["ember"][q]["ms_median"] for q in pairs])
            print(f"{t} | {p} | {shown(ms['ember'], 1)} | {shown(ms['nanogpt'], 1)} | "
                  f"**{shown(ratio, 2)}** | {len(pairs)}")
            lines.append(dict(summary="nanogpt_ms_over_ember_ms", shape=shape, threads=t, precision=p,
                              ember_ms=ms["ember"], nanogpt_ms=ms["nanogpt"], **ratio))
        if len(precisions) == 2:
            print(f"\nthreads {t}: bf16 speed-up, f32 ms ÷ bf16 ms per pair, median (range)")
            for impl in IMPLS:
                f32, bf16 = complete["f32"][impl], complete["bf16"][impl]
                pairs = sorted(set(f32) & set(bf16))
                if not pairs:
                    print(f"  {NAMES[impl]:<8} no bf16 runs (refused)")
                    continue
                s = spread([f32[q]["ms_median"] / bf16[q]["ms_median"] for q in pairs])
                print(f"  {NAMES[impl]:<8} {shown(s, 3)}, {len(pairs)} pairs")
                lines.append(dict(summary="bf16_speed_up", impl=impl, shape=shape, threads=t, **s))
            lines.append(fastest_against_fastest(complete, shape, t))
    with open(out, "a") as f:
        for line in lines:
            print(json.dumps(line), file=f)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "record":
        record(*args)
    elif command == "header":
        header(args[0].split(","))
    elif command == "pair":
        pair_row(args[0], args[1], args[2], args[3].split(","))
    elif command == "summary":
        summary(args[0], args[1].split(","))
    else:
        sys.exit(f"bench_vs_nanogpt.py: unknown command {command}")
