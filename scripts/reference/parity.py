#!/usr/bin/env python3
"""Checks that the PyTorch reference computes what Ember computes: trains a few steps of a
config with both (same initial values, same batches, dropout off) and compares the loss and
gradient norm of every step and the final validation loss.

    python scripts/reference/parity.py CONFIG [--steps 5] [--ember BIN] [--set KEY=VALUE]...

Run from the repository root with the venv's python. Exit status 1 if any value differs by more
than --tol (relative; default 1e-3 — float32 sums in a different order drift slowly).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--ember", default=os.environ.get(
        "EMBER_BIN", os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "ember")))
    args = ap.parse_args()

    # Dropout masks come from different generators, so parity is checked without dropout.
    sets = args.set + [f"train.steps={args.steps}", "train.epochs=null", "train.log_every=1",
                       "eval.every=0", "eval.bleu=false", "checkpoint.keep_best_by=loss",
                       "model.dropout=0.0", "model.attn_dropout=0.0"]
    flags = [x for s in sets for x in ("--set", s)]
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        subprocess.run([args.ember, "train", args.config, "--run-dir", run, "--quiet", *flags],
                       check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    ember = {r["step"]: r for r in records if r["kind"] == "train"}
    ember_val = [r for r in records if r["kind"] == "eval"][-1]["loss"]

    out = subprocess.run([sys.executable, os.path.join(HERE, "ember_ref.py"), args.config, "--train",
                          "--json", "--quiet", "--ember", args.ember, *flags, "--trace"],
                         check=True, capture_output=True, text=True)
    torch_run = json.loads(out.stdout.strip().splitlines()[-1])
    torch_steps = {r["step"]: r for r in torch_run["trace"]}

    worst = 0.0
    print(f"{'step':>4}  {'ember loss':>11}  {'torch loss':>11}  {'ember |g|':>10}  {'torch |g|':>10}")
    for step in sorted(ember):
        e, t = ember[step], torch_steps[step]
        for a, b in ((e["loss"], t["loss"]), (e["grad_norm"], t["grad_norm"])):
            worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
        print(f"{step:>4}  {e['loss']:>11.6f}  {t['loss']:>11.6f}  {e['grad_norm']:>10.5f}  {t['grad_norm']:>10.5f}")
    worst = max(worst, abs(ember_val - torch_run["val_loss"]) / ember_val)
    print(f"val loss: ember {ember_val:.6f}, torch {torch_run['val_loss']:.6f}; "
          f"params: torch {torch_run['params']}; worst relative difference {worst:.2e}")
    sys.exit(0 if worst <= args.tol else 1)


if __name__ == "__main__":
    main()
