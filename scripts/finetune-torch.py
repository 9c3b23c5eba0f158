#!/usr/bin/env python3
"""What fine-tuning a Hugging Face model folder costs in PyTorch, in f32 and under CPU bf16
autocast: the reference for Ember's `configs/fine-tune-smollm2.yaml` figures (issue 51 asks
Ember's bf16 for at most 0.7x f32's peak RSS; this says what PyTorch's mixed precision gives on
the same model, batch and machine).

    scripts/finetune-torch.py MODEL_DIR --text data/tinyshakespeare/input.txt \
        [--pairs 3] [--steps 4] [--warmup 1] [--batch 4] [--block 256] [--threads 2] [--out FILE]

The training step is the one `configs/fine-tune-smollm2.yaml` runs: batches of --batch x
--block tokens of --text (tokenised with the folder's tokenizer), the causal-LM loss, backward,
gradient clipping at 1.0 and AdamW (lr 1e-4, weight decay 0.1, f32 moments) on f32 weights. bf16
is `torch.autocast("cpu", torch.bfloat16)` around the forward pass, the weights, gradients and
moments staying f32, as PyTorch's mixed precision keeps them. Each run is a fresh process (its
peak RSS is its own: `VmHWM`, loading the model included); f32 and bf16 alternate in each pair.
Prints a row per run and the medians; --out appends one JSON line per run.

With --ember BIN, each pair also runs Ember's `ember bench` of --ember-config (default
configs/fine-tune-smollm2.yaml, whose batch, block, clipping and optimizer are the step above) on
the same folder (`model.init_from`) in each precision, the four runs alternating (PyTorch f32,
Ember f32, PyTorch bf16, Ember bf16), so that a machine whose speed drifts moves both sides
alike; it then prints PyTorch's time over Ember's per precision (above 1: Ember faster).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_one(args) -> dict:
    """One process's training: --warmup steps, then --steps timed ones."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with open(args.text) as f:
        ids = torch.tensor(tokenizer(f.read())["input_ids"], dtype=torch.long)
    need = args.batch * (args.block + 1)
    if len(ids) < need:
        sys.exit(f"finetune-torch: error: {args.text} has {len(ids)} tokens, a batch needs {need}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-4, foreach=False)
    generator = torch.Generator().manual_seed(1)
    bf16 = args.precision == "bf16"

    def step():
        starts = torch.randint(0, len(ids) - args.block - 1, (args.batch,), generator=generator)
        x = torch.stack([ids[s:s + args.block] for s in starts])
        y = torch.stack([ids[s + 1:s + args.block + 1] for s in starts])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(args.warmup):
        step()
    ms = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t) * 1e3)
    return dict(precision=args.precision, ms_per_step_median=statistics.median(ms),
                ms_per_step=ms, peak_rss_mib=peak_rss_mib(), threads=args.threads,
                batch=args.batch, block=args.block, torch=torch.__version__,
                model=os.path.abspath(args.model))


def run_ember(args, precision) -> dict:
    """One `ember bench` process in `precision`: its --json result, with peak RSS as above."""
    cmd = [args.ember, "bench", args.ember_config, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--json", "--set", f"model.init_from={args.model}",
           "--set", f"train.threads={args.threads}", "--set", f"train.precision={precision}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"finetune-torch: error: Ember's {precision} run failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    return dict(framework="ember", precision=precision, ms_per_step_median=r["ms_per_step_median"],
                peak_rss_mib=r["peak_rss_mib"], threads=args.threads, binary=args.ember,
                config=args.ember_config, model=os.path.abspath(args.model), bench=r)


def median_of(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--text", required=True)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out")
    p.add_argument("--ember", help="an ember binary whose runs alternate with PyTorch's")
    p.add_argument("--ember-config", default="configs/fine-tune-smollm2.yaml")
    p.add_argument("--precision", choices=["f32", "bf16"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.precision:
        print(json.dumps(run_one(args)))
        return
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"finetune-torch: error: {args.model} has no config.json (a Hugging Face model folder)")
    if args.ember and not os.path.isfile(args.ember_config):
        sys.exit(f"finetune-torch: error: --ember-config {args.ember_config}: no such file")
    rows, ember_rows = [], []
    for pair in range(1, args.pairs + 1):
        for precision in ("f32", "bf16"):
            cmd = [sys.executable, __file__, args.model, "--text", args.text, "--steps",
                   str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
                   "--block", str(args.block), "--threads", str(args.threads),
                   "--precision", precision]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"finetune-torch: error: the {precision} run failed:\n{out.stderr[-2000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1]) | {"pair": pair}
            runs = [("PyTorch", r)]
            rows.append(r)
            if args.ember:
                e = run_ember(args, precision) | {"pair": pair}
                ember_rows.append(e)
                runs.append(("Ember", e))
            for who, run in runs:
                print(f"pair {pair} {who:>7} {precision:>4}: {run['ms_per_step_median']:8.1f} ms/step, "
                      f"peak RSS {run['peak_rss_mib']:7.0f} MiB", flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        print(json.dumps(run), file=f)
    by = {pr: [r for r in rows if r["precision"] == pr] for pr in ("f32", "bf16")}
    speed = [a["ms_per_step_median"] / b["ms_per_step_median"] for a, b in zip(by["f32"], by["bf16"])]
    rss = [b["peak_rss_mib"] / a["peak_rss_mib"] for a, b in zip(by["f32"], by["bf16"])]
    for pr in ("f32", "bf16"):
        print(f"{pr:>4}: median {statistics.median(r['ms_per_step_median'] for r in by[pr]):.1f} ms/step, "
              f"peak RSS {statistics.median(r['peak_rss_mib'] for r in by[pr]):.0f} MiB")
    print(f"f32 ms / bf16 ms: median {statistics.median(speed):.3f} ({min(speed):.3f}-{max(speed):.3f}); "
          f"bf16 / f32 peak RSS: median {statistics.median(rss):.3f} ({min(rss):.3f}-{max(rss):.3f})")
    if ember_rows:
        for pr in ("f32", "bf16"):
            ember = [r for r in ember_rows if r["precision"] == pr]
            speed = [t["ms_per_step_median"] / e["ms_per_step_median"] for t, e in zip(by[pr], ember)]
            rss = [e["peak_rss_mib"] / t["peak_rss_mib"] for t, e in zip(by[pr], ember)]
            print(f"Ember {pr:>4}: median {median_of(ember, 'ms_per_step_median'):.1f} ms/step, "
                  f"peak RSS {median_of(ember, 'peak_rss_mib'):.0f} MiB; PyTorch ms / Ember ms: median "
                  f"{statistics.median(speed):.3f} ({min(speed):.3f}-{max(speed):.3f}); Ember / PyTorch "
                  f"peak RSS: median {statistics.median(rss):.3f} ({min(rss):.3f}-{max(rss):.3f})")


if __name__ == "__main__":
    main()
