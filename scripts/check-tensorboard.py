#!/usr/bin/env python3
"""Reads Ember's TensorBoard event files with TensorBoard's own reader and checks them against
metrics.jsonl.

For every run directory under LOGDIR (a directory holding metrics.jsonl), loads its event files
with tensorboard's EventAccumulator (the reader `tensorboard --logdir` uses, CRCs included) and
checks that train/loss, train/lr and eval/loss hold the same steps and values (to f32) as
metrics.jsonl; prints each run's tags and last values. Exits non-zero on any mismatch.

    python -m pip install tensorboard
    scripts/check-tensorboard.py runs/my-ablation [--json RESULT.json]
"""
import argparse
import json
import os
import sys

import tensorboard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def metrics(run_dir):
    """(tag -> [(step, value)]) from metrics.jsonl, keeping the last record of a step as a
    resumed run's log does."""
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        pairs = (
            [("train/loss", r["loss"]), ("train/lr", r["lr"])]
            if r["kind"] == "train"
            else [("eval/loss", r["loss"])]
        )
        for tag, v in pairs:
            out.setdefault(tag, {})[r["step"]] = v
    return {t: sorted(d.items()) for t, d in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir")
    ap.add_argument("--json", help="also write the result to this JSON file")
    args = ap.parse_args()
    runs = sorted(root for root, _, files in os.walk(args.logdir) if "metrics.jsonl" in files)
    if not runs:
        print(f"no run directory (with metrics.jsonl) under {args.logdir}", file=sys.stderr)
        return 1
    result, ok = {"tensorboard": tensorboard.__version__, "runs": {}}, True
    for run in runs:
        ea = EventAccumulator(run, size_guidance={"scalars": 0})
        ea.Reload()
        tags = sorted(ea.Tags()["scalars"])
        name = os.path.relpath(run, args.logdir)
        summary = {"scalar_tags": len(tags), "tags": tags}
        for tag, expected in metrics(run).items():
            got = [(e.step, e.value) for e in ea.Scalars(tag)] if tag in tags else []
            same = len(got) == len(expected) and all(
                gs == es and abs(gv - ev) <= 1e-6 * max(1.0, abs(ev)) for (gs, gv), (es, ev) in zip(got, expected)
            )
            summary[tag] = {"points": len(got), "last": got[-1] if got else None, "matches_metrics_jsonl": same}
            if not same:
                ok = False
                print(f"FAIL {name} {tag}: TensorBoard has {got[:3]}..., metrics.jsonl {expected[:3]}...", file=sys.stderr)
        result["runs"][name] = summary
        print(f"{name}: {len(tags)} scalar tags; " + ", ".join(
            f"{t} {summary[t]['points']} points, last {summary[t]['last']}" for t in ("train/loss", "eval/loss") if t in summary))
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)
    print("OK: every run's event files match its metrics.jsonl" if ok else "FAIL", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
