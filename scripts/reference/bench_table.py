#!/usr/bin/env python3
"""Formats the results file of scripts/bench-vs-torch.sh (one JSON object per line).

    bench_table.py header
    bench_table.py row FILE PAIR [THREADS]   # the table row of one Ember/PyTorch pair
    bench_table.py summary FILE [THREADS]    # medians over all pairs (of one thread setting)
    bench_table.py scaling FILE              # a thread sweep: ms/step per thread count, both sides
    bench_table.py compact            # stdin JSON (pretty or not) → one line on stdout

Standard library only, so it runs under any python3.
"""

import json
import statistics
import sys

COLUMNS = ("pair", "ember ms", "ember tok/s", "ember MiB", "torch ms", "torch tok/s", "torch MiB", "ratio")
WIDTHS = (4, 10, 12, 10, 10, 12, 10, 7)


def line(cells) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, WIDTHS))


def load(path: str, threads: str | None = None) -> dict:
    """{pair: {"ember": record, "torch": record}}, of one thread setting if given."""
    pairs = {}
    with open(path) as f:
        for text in f:
            r = json.loads(text)
            if r.get("kind") == "bench" and threads in (None, r.get("threads_setting", "default")):
                pairs.setdefault(r["pair"], {})[r["impl"]] = r
    return pairs


def settings(path: str) -> list:
    """The thread settings in a results file, in the order they first appear."""
    seen = []
    with open(path) as f:
        for text in f:
            r = json.loads(text)
            t = r.get("threads_setting", "default")
            if r.get("kind") == "bench" and t not in seen:
                seen.append(t)
    return seen


def row(p: int, e: dict, t: dict) -> str:
    ratio = e["tokens_per_sec"] / t["tokens_per_sec"]
    return line((p, f"{e['ms_per_step_median']:.1f}", f"{e['tokens_per_sec']:.0f}", f"{e['peak_rss_mib']:.0f}",
                 f"{t['ms_per_step_median']:.1f}", f"{t['tokens_per_sec']:.0f}", f"{t['peak_rss_mib']:.0f}",
                 f"{ratio:.3f}"))


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "header":
        print(line(COLUMNS))
    elif cmd == "row":
        pair = int(sys.argv[3])
        r = load(sys.argv[2], sys.argv[4] if len(sys.argv) > 4 else None)[pair]
        print(row(pair, r["ember"], r["torch"]))
    elif cmd == "summary":
        threads = sys.argv[3] if len(sys.argv) > 3 else None
        pairs = [r for _, r in sorted(load(sys.argv[2], threads).items()) if "ember" in r and "torch" in r]
        if not pairs:
            sys.exit("no complete pair in the results file")
        med = lambda k, impl: statistics.median(r[impl][k] for r in pairs)
        ratios = [r["ember"]["tokens_per_sec"] / r["torch"]["tokens_per_sec"] for r in pairs]
        print(line(("med", f"{med('ms_per_step_median', 'ember'):.1f}", f"{med('tokens_per_sec', 'ember'):.0f}",
                    f"{med('peak_rss_mib', 'ember'):.0f}", f"{med('ms_per_step_median', 'torch'):.1f}",
                    f"{med('tokens_per_sec', 'torch'):.0f}", f"{med('peak_rss_mib', 'torch'):.0f}",
                    f"{statistics.median(ratios):.3f}")))
        print(f"\nmedian ratio (Ember tokens/s ÷ PyTorch tokens/s) over {len(pairs)} pair(s): "
              f"{statistics.median(ratios):.3f}  (min {min(ratios):.3f}, max {max(ratios):.3f})")
        # On a shared machine other tenants slow some steps of some runs; each run's 10th
        # percentile step time is the least disturbed view of its speed (same tokens per step).
        if all("ms_per_step_p10" in r[impl] for r in pairs for impl in ("ember", "torch")):
            fast = [r["torch"]["ms_per_step_p10"] / r["ember"]["ms_per_step_p10"] for r in pairs]
            print(f"on p10 step times (less sensitive to other load): median ratio {statistics.median(fast):.3f}"
                  f"  (Ember {med('ms_per_step_p10', 'ember'):.1f} ms, PyTorch {med('ms_per_step_p10', 'torch'):.1f} ms)")
    elif cmd == "scaling":
        print("threads | Ember ms/step median (p10) | PyTorch ms/step median (p10) | ratio (PyTorch ms ÷ Ember ms), median of pairs")
        print("---|---|---|---")
        for t in settings(sys.argv[2]):
            pairs = [r for _, r in sorted(load(sys.argv[2], t).items()) if "ember" in r and "torch" in r]
            med = lambda k, impl: statistics.median(r[impl][k] for r in pairs)
            ratios = [r["torch"]["ms_per_step_median"] / r["ember"]["ms_per_step_median"] for r in pairs]
            print(f"{t} | {med('ms_per_step_median', 'ember'):.1f} ({med('ms_per_step_p10', 'ember'):.1f}) | "
                  f"{med('ms_per_step_median', 'torch'):.1f} ({med('ms_per_step_p10', 'torch'):.1f}) | "
                  f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}), {len(pairs)} pairs")
    elif cmd == "compact":
        print(json.dumps(json.load(sys.stdin)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
