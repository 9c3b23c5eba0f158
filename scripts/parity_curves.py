"""Collects the validation curves of scripts/nanogpt-parity.sh's runs into curves.csv,
curves.json, table.md and val_loss.png.

    python scripts/parity_curves.py OUT

OUT holds one folder per side (nanoGPT, Ember, or a variant of either), each with a side.json
({"impl": "nanogpt" | "ember", ...}, written by the shell script) and one folder per run named
lr<LR>-seed<S>: for nanoGPT its stdout as train.log ("step N: train loss X, val loss Y" at every
evaluation), for Ember its run directory (metrics.jsonl, `kind: eval` records).
"""

import csv
import json
import re
import statistics
import sys
from pathlib import Path

RUN_NAME = re.compile(r"^lr(?P<lr>[^-]+(?:-\d+)?)-seed(?P<seed>\d+)$")
NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([0-9.naif]+), val loss ([0-9.naif]+)$")


def nanogpt_curve(run: Path) -> list[tuple[int, float]]:
    log = run / "train.log"
    if not log.is_file():
        return []
    return [(int(m[1]), float(m[3])) for m in map(NANOGPT_EVAL.match, log.read_text().splitlines()) if m]


def ember_curve(run: Path) -> list[tuple[int, float]]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return []
    records = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
    return [(r["step"], r["loss"]) for r in records if r.get("kind") == "eval" and r.get("split") == "valid"]


def collect(out: Path) -> tuple[dict, list[dict]]:
    """Every side's metadata, and one row per (side, lr, seed, step)."""
    sides, rows = {}, []
    for side_json in sorted(out.glob("*/side.json")):
        side = side_json.parent
        meta = json.loads(side_json.read_text())
        sides[side.name] = meta
        curve_of = nanogpt_curve if meta["impl"] == "nanogpt" else ember_curve
        for run in sorted(p for p in side.iterdir() if p.is_dir()):
            name = RUN_NAME.match(run.name)
            if not name:
                continue
            for step, loss in curve_of(run):
                rows.append(dict(side=side.name, impl=meta["impl"], lr=float(name["lr"]),
                                 seed=int(name["seed"]), step=step, val_loss=loss))
    return sides, rows


def grouped(rows: list[dict]) -> dict:
    """{(side, lr, step): {seed: val_loss}}, in side, lr, step order."""
    groups = {}
    for r in sorted(rows, key=lambda r: (r["side"], r["lr"], r["step"], r["seed"])):
        groups.setdefault((r["side"], r["lr"], r["step"]), {})[r["seed"]] = r["val_loss"]
    return groups


def table(rows: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in rows})
    head = ["side", "lr", "step", *(f"seed {s}" for s in seeds), "mean", "min–max"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (side, lr, step), by_seed in grouped(rows).items():
        vals = list(by_seed.values())
        cells = [side, f"{lr:g}", str(step), *(f"{by_seed[s]:.3f}" if s in by_seed else "" for s in seeds),
                 f"{statistics.mean(vals):.3f}", f"{min(vals):.3f}–{max(vals):.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"parity_curves: matplotlib is not installed; no {path.name} "
              "(pip install matplotlib into the torch venv)", file=sys.stderr)
        return False
    lrs = sorted({r["lr"] for r in rows})
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs) + 3, 4.5), squeeze=False)
    # Step 0 is left out: nanoGPT logs its evaluation at initialisation (~4.2), Ember does not.
    groups = {k: v for k, v in grouped(rows).items() if k[2] > 0}
    for ax, lr in zip(axes[0], lrs):
        for side in dict.fromkeys(r["side"] for r in rows):
            points = [(step, list(v.values())) for (s, l, step), v in groups.items() if s == side and l == lr]
            if not points:
                continue
            steps = [p for p, _ in points]
            line, = ax.plot(steps, [statistics.mean(v) for _, v in points], marker="o", ms=3,
                            label=f"{side} ({seeds(max(len(v) for _, v in points))})")
            ax.fill_between(steps, [min(v) for _, v in points], [max(v) for _, v in points],
                            color=line.get_color(), alpha=0.2)
        ax.set(title=f"peak lr {lr:g}", xlabel="step", ylabel="validation loss (nats/char)")
        ax.grid(alpha=0.3)
    # Outside the last panel: with a few variants a legend inside covers the curves.
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")
    fig.suptitle("Tiny Shakespeare char LM: mean over seeds, band = min–max")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(out: Path) -> None:
    sides, rows = collect(out)
    if not rows:
        sys.exit(f"parity_curves: no evaluations found under {out}")
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "curves.json").write_text(json.dumps(dict(sides=sides, curves=rows), indent=1) + "\n")
    md = table(rows)
    (out / "table.md").write_text(md)
    print(md, end="")
    written = ["curves.csv", "curves.json", "table.md"] + (["val_loss.png"] if plot(rows, out / "val_loss.png") else [])
    print(f"wrote {', '.join(str(out / n) for n in written)}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: parity_curves.py OUT")
    main(Path(sys.argv[1]))
