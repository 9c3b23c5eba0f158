#!/usr/bin/env python3
"""PyTorch reference implementation of an Ember config, for side-by-side speed comparison.

Reads the same YAML as `ember` (with the same `--set a.b=v` overrides), builds the same model
(same parameter names, count and initial values), the same batches, the same loss and the same
AdamW, and runs it on the CPU in float32:

    python scripts/reference/ember_ref.py CONFIG --params              # parameter count
    python scripts/reference/ember_ref.py CONFIG --bench [--steps 30] [--warmup 3] [--json]
    python scripts/reference/ember_ref.py CONFIG --train [--json]      # full run with evaluation

`--bench` times the training step exactly as `ember bench` does and prints the same JSON field
names. `--autocast bf16` runs the forward pass and the loss under `torch.autocast` in bf16 (the
mixed precision PyTorch users turn on; `train.precision: bf16`'s counterpart), `--compile` the
model through `torch.compile`. Run it from the repository root (config paths are relative to the working directory, as
for `ember`). See scripts/reference/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
from model import ModelConfig, Transformer, init_like_ember  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Config: YAML + --set overrides, Ember's defaults (crates/trainer/src/config.rs)
# ---------------------------------------------------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML speaks YAML 1.1, where `3e-3` is a string; Ember's parser (YAML 1.2) reads a
    float. Teach the loader 1.2's float syntax so `--set train.lr=3e-3` means the same."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_config(path: str, overrides: list) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            tree = yaml.load(f, Loader=_Yaml12Loader) or {}
    except FileNotFoundError:
        sys.exit(f"error: {path}: no such config file")
    for o in overrides:
        if "=" not in o:
            sys.exit(f"error: --set {o!r}: expected KEY=VALUE, e.g. --set train.lr=3e-3")
        key, value = o.split("=", 1)
        parts = key.split(".")
        if any(not p for p in parts):
            sys.exit(f"error: --set {o!r}: malformed key; use dotted keys like train.lr")
        node = tree
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                sys.exit(f"error: --set {key}: {'.'.join(parts[: i + 1])} is not a mapping")
        node[parts[-1]] = yaml.load(value, Loader=_Yaml12Loader)
    return tree


class Settings:
    """A config section with defaults; unknown keys are ignored (they do not affect speed)."""

    def __init__(self, section: dict | None, defaults: dict):
        section = section or {}
        for k, v in defaults.items():
            setattr(self, k, section.get(k, v))


TRAIN_DEFAULTS = dict(
    steps=None, epochs=None, seed=0, lr=None, schedule="cosine", warmup_steps=0, min_lr=0.0,
    max_tokens=None, batch_size=None, block_size=None, windows="sampled", accumulation=1,
    clip_grad_norm=1.0, label_smoothing=0.0, z_loss=0.0, weight_decay=0.01,
    decay_embeddings=False, beta1=0.9, beta2=0.98, adam_eps=1e-8, on_nonfinite="stop",
    log_every=10, threads=None,
)
EVAL_DEFAULTS = dict(every=500, max_tokens=8192, max_batches=None)


def train_settings(tree: dict) -> Settings:
    t = Settings(tree.get("train"), TRAIN_DEFAULTS)
    if t.lr is None:
        sys.exit("error: train.lr: required")
    if (t.steps is None) == (t.epochs is None):
        sys.exit("error: train.steps: set exactly one of train.steps and train.epochs")
    for k in ("lr", "min_lr", "label_smoothing", "z_loss", "weight_decay", "beta1", "beta2", "adam_eps"):
        setattr(t, k, float(getattr(t, k)))
    if t.clip_grad_norm is not None:
        t.clip_grad_norm = float(t.clip_grad_norm)
    if t.schedule not in ("constant", "cosine", "inverse_sqrt"):
        sys.exit(f"error: train.schedule: {t.schedule!r} is not one of constant, cosine, inverse_sqrt")
    return t


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def default_ember_bin() -> str:
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    return os.environ.get("EMBER_BIN", os.path.join(target, "release", "ember"))


def ember_run_dir(args, tree: dict) -> str:
    """An Ember run directory holding tokenizer.json and token-cache.bin for this data config.

    Ember trains its BPE vocabulary (deterministically) and tokenises in Rust; rather than
    re-implement that, we let Ember do it once: a 1-step `ember train` into a directory keyed by
    a hash of the data section, then read its token ids. `--ember-run DIR` uses an existing run.
    """
    if args.ember_run:
        return args.ember_run
    key = hashlib.sha256(json.dumps(tree.get("data"), sort_keys=True, default=str).encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(args.config))[0]
    final = os.path.join("runs", "torch-ref-data", f"{stem}-{key}")
    if os.path.exists(os.path.join(final, "token-cache.bin")):
        return final
    ember = args.ember or default_ember_bin()
    if not os.access(ember, os.X_OK):
        sys.exit(
            f"error: this corpus/tokenizer needs Ember's token ids, and {ember} is missing; build it "
            "(cargo build --release), pass --ember PATH, or pass --ember-run DIR of an existing run"
        )
    tmp = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [ember, "train", args.config, "--run-dir", tmp, "--quiet"]
    for o in args.set:
        cmd += ["--set", o]
    # One step, no BLEU decoding: we only want the tokenizer and the token cache it leaves.
    for o in ("train.steps=1", "train.epochs=null", "eval.every=0", "eval.bleu=false",
              "checkpoint.every=0", "checkpoint.keep_best_by=loss"):
        cmd += ["--set", o]
    print(f"[ember_ref] preparing token ids with Ember: {' '.join(cmd)}", file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 or not os.path.exists(os.path.join(tmp, "token-cache.bin")):
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(f"error: preparing token ids with Ember failed:\n{done.stderr.strip()}")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_splits(args, tree: dict):
    """(splits, translation?) for the config's data section."""
    data = tree.get("data") or {}
    corpus = data.get("corpus") or {"kind": "embedded"}
    tokenizer = data.get("tokenizer") or {}
    kind = corpus.get("kind")
    if kind not in ("text", "parallel", "embedded"):
        sys.exit(f"error: data.corpus.kind: {kind!r} is not one of embedded, parallel, text")
    translation = kind != "text"
    if kind == "text" and tokenizer.get("kind", "bpe") == "char" and not args.ember_run:
        return D.char_text_splits(corpus, tokenizer), False
    run_dir = ember_run_dir(args, tree)
    splits = D.ember_splits(
        run_dir, translation, int(data.get("max_source_len", 256)), int(data.get("max_target_len", 256))
    )
    return splits, translation


def resolve_model(tree: dict, splits, translation: bool, t: Settings) -> ModelConfig:
    section = dict(tree.get("model") or {})
    try:
        cfg = ModelConfig(section)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if cfg.vocab_size is None:
        cfg.vocab_size = splits.vocab_size
    elif cfg.vocab_size != splits.vocab_size:
        sys.exit(f"error: model.vocab_size is {cfg.vocab_size} but the tokenizer has {splits.vocab_size} tokens")
    if translation != (cfg.arch == "seq2seq"):
        sys.exit("error: model.arch: a text corpus needs arch lm, a translation corpus arch seq2seq")
    if cfg.qk_norm == "l2" and cfg.qk_norm_init_scale is None and cfg.qk_norm_length is None:
        # As the trainer does: L = the 97.5th percentile of training lengths (or the block).
        if translation:
            src = [len(s) for s, _ in splits.train]
            tgt = [len(x) for _, x in splits.train]
            cfg.qk_norm_length = max(D.percentile(src, 0.975), D.percentile(tgt, 0.975) + 1, 2)
        else:
            cfg.qk_norm_length = max(t.block_size or cfg.max_seq_len, 2)
    return cfg


def make_batcher(splits, translation: bool, t: Settings):
    if translation:
        if not t.max_tokens:
            sys.exit("error: train.max_tokens: translation needs it (e.g. 4096)")
        return D.TokenBudgetBatcher(splits.train, int(t.max_tokens), int(t.seed))
    if not (t.batch_size and t.block_size):
        sys.exit("error: train.batch_size: language models need train.batch_size and train.block_size")
    return D.LmWindowBatcher(splits.train, int(t.batch_size), int(t.block_size), int(t.seed), t.windows)


# Where the model and batches live (--device); the CPU unless asked otherwise.
DEVICE = torch.device("cpu")
# `--autocast`: the dtype the forward pass and the loss run in under torch.autocast (None: f32).
AUTOCAST = None


def autocast():
    """torch.autocast on DEVICE in AUTOCAST's dtype, or nothing."""
    if AUTOCAST is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=DEVICE.type, dtype=AUTOCAST)


def clock() -> float:
    """time.perf_counter() once the device has finished what was queued: CUDA runs
    asynchronously, so a timer read without a synchronize would time the launches only."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return time.perf_counter()


def to_tensors(batch) -> dict:
    """A batch as tensors on DEVICE; targets at padding are -100, which cross_entropy ignores."""
    dev = lambda a: torch.from_numpy(a).to(DEVICE)
    if isinstance(batch, D.LmBatch):
        return dict(tokens=dev(batch.input), targets=dev(batch.target), n_tokens=batch.n_tokens)
    targets = dev(batch.tgt_out).masked_fill(dev(~batch.tgt_mask), -100)
    return dict(tokens=dev(batch.tgt_in), src=dev(batch.src), src_mask=dev(batch.src_mask),
                targets=targets, n_tokens=batch.n_tokens)


# ---------------------------------------------------------------------------------------------
# Loss, optimizer, schedule (crates/trainer/src/step/loss.rs, optim.rs)
# ---------------------------------------------------------------------------------------------


def objective_sum(model, bt: dict, t: Settings):
    """Σ over real target tokens of (1−ε)·NLL + ε·mean_v(−log p) + z·log²Z; also the logits."""
    logits = model(bt["tokens"], src=bt.get("src"), src_mask=bt.get("src_mask"))
    logits = logits.view(-1, logits.shape[-1])
    targets = bt["targets"].view(-1)
    loss = F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum",
                           label_smoothing=t.label_smoothing)
    if t.z_loss > 0:
        lse = torch.logsumexp(logits.float(), dim=-1)  # f32 under autocast too, as Ember's
        loss = loss + t.z_loss * (lse.square() * (targets != -100)).sum()
    return loss, logits


def make_optimizer(model, t: Settings):
    """AdamW with Ember's groups: matrices decay; norms, biases, scales and (unless
    decay_embeddings) the embedding/output matrices do not."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_embedding = name.startswith(("embed.", "lm_head."))
        (decay if p.dim() >= 2 and (t.decay_embeddings or not is_embedding) else no_decay).append(p)
    groups = [dict(params=decay, weight_decay=t.weight_decay), dict(params=no_decay, weight_decay=0.0)]
    kw = dict(lr=t.lr, betas=(t.beta1, t.beta2), eps=t.adam_eps)
    # The fastest implementation available (CPU or CUDA): fused (PyTorch >= 2.4), else multi-tensor.
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def lr_at(step: int, t: Settings, total: int) -> float:
    """Learning rate of update `step` (1-based): linear warmup, then the schedule."""
    step, warmup = max(step, 1), int(t.warmup_steps)
    if step <= warmup:
        return t.lr * step / warmup
    if t.schedule == "constant":
        return t.lr
    if t.schedule == "cosine":
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + math.cos(math.pi * progress))
    return t.lr * math.sqrt(max(warmup, 1) / step)


def clip_and_norm(params, max_norm):
    """Global L2 norm of the gradients, scaled to at most max_norm (None: measure only)."""
    limit = float("inf") if max_norm is None else max_norm
    return torch.nn.utils.clip_grad_norm_(params, limit, foreach=True).item()


class Trainer:
    def __init__(self, model, t: Settings, total_steps: int):
        self.model, self.t, self.total = model, t, total_steps
        self.params = [p for p in model.parameters()]
        self.opt, self.opt_impl = make_optimizer(model, t)
        self.step_no = 0
        self.skipped = 0

    def step(self, batches: list, keep_logits: bool = False) -> dict:
        """One optimizer update over `batches` (micro-batches), timed like ember bench: from
        tensor creation to the end of the AdamW update. Returns times and losses (and the
        logits, for logging, only when asked: holding them would inflate peak memory)."""
        t0 = clock()
        tensors = [to_tensors(b) for b in batches]
        total = max(sum(bt["n_tokens"] for bt in tensors), 1)
        self.opt.zero_grad(set_to_none=True)
        fwd = bwd = objective = 0.0
        logits_list = []
        for bt in tensors:
            t1 = clock()
            with autocast():
                loss, logits = objective_sum(self.model, bt, self.t)
            objective = objective + loss.detach()  # read once below: no sync per micro-batch
            t2 = clock()
            (loss / total).backward()
            t3 = clock()
            fwd, bwd = fwd + (t2 - t1), bwd + (t3 - t2)
            if keep_logits:
                logits_list.append(logits.detach())
        objective = float(objective)
        t4 = clock()
        norm = clip_and_norm(self.params, self.t.clip_grad_norm)
        self.step_no += 1
        lr = lr_at(self.step_no, self.t, self.total)
        if not (math.isfinite(objective) and math.isfinite(norm)):
            what = f"the loss is {objective / total}" if not math.isfinite(objective) else "a gradient is not finite"
            if self.t.on_nonfinite == "stop":
                sys.exit(f"error: step {self.step_no}: {what}; the update was not applied")
            self.skipped += 1
        else:
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
        t5 = clock()
        return dict(secs=t5 - t0, forward=fwd, backward=bwd, optimizer=t5 - t4, tokens=total,
                    loss=objective / total, lr=lr, grad_norm=norm, logits=logits_list, tensors=tensors)


@torch.no_grad()
def evaluate(model, splits, translation: bool, t: Settings, ev: Settings) -> float:
    """Mean NLL per target token on the validation split, without dropout."""
    model.eval()
    if translation:
        batches = D.pair_eval_batches(splits.valid, int(ev.max_tokens))
    else:
        batches = D.lm_eval_batches(splits.valid, int(t.batch_size), int(t.block_size), ev.max_batches)
    nll = tokens = 0.0
    for b in batches:
        bt = to_tensors(b)
        logits = model(bt["tokens"], src=bt.get("src"), src_mask=bt.get("src_mask"))
        nll += F.cross_entropy(logits.view(-1, logits.shape[-1]), bt["targets"].view(-1),
                               ignore_index=-100, reduction="sum").item()
        tokens += bt["n_tokens"]
    model.train()
    return nll / max(tokens, 1)


# ---------------------------------------------------------------------------------------------
# Bench and train
# ---------------------------------------------------------------------------------------------


def _status_mib(field: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def peak_rss_mib() -> float:
    """Peak resident set size (VmHWM), as bench.rs reports it."""
    return _status_mib("VmHWM")


# What importing PyTorch alone costs in resident memory (the PyPI build maps its CUDA
# libraries even on the CPU): part of peak_rss_mib, reported so it can be told apart.
RSS_AFTER_IMPORT_MIB = _status_mib("VmRSS")


def flops_per_token(cfg: ModelConfig, src_len: float, tgt_len: float) -> float:
    """bench.rs's analytic training FLOPs per target token (PaLM appendix B)."""
    d = cfg.d_model
    kv = cfg.kv_heads * cfg.head_dim
    attn_proj = 2 * d * d + 2 * d * kv
    mlp = (3 if cfg.mlp == "swiglu" else 2) * d * cfg.d_ff
    layer, head, n = attn_proj + mlp, cfg.vocab_size * d, cfg.decoder_layers
    if cfg.arch == "lm":
        return 6.0 * (n * layer + head) + 12.0 * n * d * tgt_len
    e = cfg.encoder_layers
    encoder = 6.0 * e * layer + 12.0 * e * d * src_len
    decoder = 6.0 * (n * (layer + attn_proj) + head) + 12.0 * n * d * (tgt_len + src_len)
    return encoder * src_len / max(tgt_len, 1.0) + decoder


def total_steps_of(t: Settings, batcher) -> int:
    if t.steps is not None:
        return int(t.steps)
    return max(math.ceil(float(t.epochs) * batcher.per_epoch / int(t.accumulation)), 1)


def bench(model, cfg, splits, translation, t: Settings, steps: int, warmup: int) -> dict:
    batcher = make_batcher(splits, translation, t)
    trainer = Trainer(model, t, steps + warmup)
    total, fwd, bwd, opt, rates = [], [], [], [], []
    src_tokens = tgt_tokens = rows = 0
    for i in range(steps + warmup):
        batches = [batcher.next_batch() for _ in range(int(t.accumulation))]
        r = trainer.step(batches)
        if i >= warmup:
            total.append(r["secs"] * 1e3)
            fwd.append(r["forward"] * 1e3)
            bwd.append(r["backward"] * 1e3)
            opt.append(r["optimizer"] * 1e3)
            rates.append(r["tokens"] / r["secs"])
            for b in batches:
                tgt_tokens += b.n_tokens
                rows += b.target.shape[0] if isinstance(b, D.LmBatch) else b.src.shape[0]
                src_tokens += getattr(b, "n_src_tokens", 0)
    median = lambda v: sorted(v)[len(v) // 2]  # the upper median, as bench.rs takes it
    s = sorted(total)
    fpt = flops_per_token(cfg, src_tokens / max(rows, 1), tgt_tokens / max(rows, 1))
    tps = median(rates)
    return dict(
        impl="pytorch", torch_version=torch.__version__, optimizer_impl=trainer.opt_impl,
        steps=steps, warmup=warmup, params=model.num_params(), threads=torch.get_num_threads(),
        ms_per_step_median=median(total), ms_per_step_p10=s[len(s) // 10],
        ms_per_step_p90=s[(len(s) * 9) // 10], forward_ms=median(fwd), backward_ms=median(bwd),
        optimizer_ms=median(opt), tokens_per_sec=tps, tokens_per_step=tgt_tokens / steps,
        peak_rss_mib=peak_rss_mib(), rss_after_import_mib=RSS_AFTER_IMPORT_MIB,
        flops_per_token=fpt, achieved_gflops=fpt * tps / 1e9, device=str(DEVICE),
        **gpu_memory(),
    )


def gpu_memory() -> dict:
    """Peak GPU memory of the tensors PyTorch allocated, and what its caching allocator reserved."""
    if DEVICE.type != "cuda":
        return {}
    return dict(peak_gpu_allocated_mib=torch.cuda.max_memory_allocated(DEVICE) / 2**20,
                peak_gpu_reserved_mib=torch.cuda.max_memory_reserved(DEVICE) / 2**20)


def train(model, cfg, splits, translation, t: Settings, ev: Settings, quiet: bool, trace: bool) -> dict:
    wall0 = time.perf_counter()
    batcher = make_batcher(splits, translation, t)
    total_steps = total_steps_of(t, batcher)
    trainer = Trainer(model, t, total_steps)
    log_every, eval_every = max(int(t.log_every), 1), int(ev.every)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    say(f"{cfg.arch} model, {model.num_params()} parameters, {total_steps} steps, "
        f"{torch.get_num_threads()} thread(s), AdamW {trainer.opt_impl}")
    train_secs, win_loss, win_nll, win_tokens, win_secs = 0.0, 0.0, 0.0, 0, 0.0
    val_loss, evals, steps_trace = None, [], []
    for step in range(1, total_steps + 1):
        log_now = step % log_every == 0 or step == total_steps
        r = trainer.step([batcher.next_batch() for _ in range(int(t.accumulation))], keep_logits=log_now)
        train_secs += r["secs"]
        if log_now:  # plain NLL for the log (off the timed step, as it is not on Ember's either)
            with torch.no_grad():
                nll = sum(F.cross_entropy(lg, bt["targets"].view(-1), ignore_index=-100, reduction="sum").item()
                          for lg, bt in zip(r["logits"], r["tensors"]))
            win_nll += nll
        if trace:
            steps_trace.append(dict(step=step, loss=r["loss"], grad_norm=r["grad_norm"], lr=r["lr"]))
        win_loss += r["loss"] * r["tokens"]
        win_tokens += r["tokens"]
        win_secs += r["secs"]
        if log_now:
            say(f"step {step:>6}: loss {win_loss / win_tokens:.4f} | nll(last) {nll / r['tokens']:.4f} | "
                f"lr {r['lr']:.3e} | grad norm {r['grad_norm']:.3f} | {win_tokens / win_secs:,.0f} tok/s")
            win_loss, win_nll, win_tokens, win_secs = 0.0, 0.0, 0, 0.0
        if step == total_steps or (eval_every > 0 and step % eval_every == 0):
            e0 = time.perf_counter()
            val_loss = evaluate(model, splits, translation, t, ev)
            evals.append(dict(step=step, val_loss=val_loss))
            say(f"step {step:>6}: val loss {val_loss:.4f} | ppl {math.exp(val_loss):.2f} "
                f"({time.perf_counter() - e0:.1f}s)")
    wall = time.perf_counter() - wall0
    extra = dict(trace=steps_trace) if trace else {}
    return dict(**extra, impl="pytorch", torch_version=torch.__version__, params=model.num_params(),
                threads=torch.get_num_threads(), steps=total_steps, val_loss=val_loss,
                val_ppl=math.exp(val_loss), train_secs=train_secs, wall_secs=wall,
                skipped_steps=trainer.skipped, evals=evals, peak_rss_mib=peak_rss_mib())


def set_device(name: str) -> None:
    """Points DEVICE at `name` (`cpu`, `cuda`, `cuda:N`), or exits saying why it cannot."""
    global DEVICE
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        sys.exit(f"error: device: must be cpu or cuda[:N], got {name!r}")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit(f"error: device {name}: this PyTorch ({torch.__version__}) sees no CUDA device; "
                     "use --device cpu")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            sys.exit(f"error: device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    DEVICE = torch.device(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bench", action="store_true", help="time the training step like `ember bench`")
    mode.add_argument("--train", action="store_true", help="train the config's steps with evaluation")
    mode.add_argument("--params", action="store_true", help="print the parameter count and exit")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--steps", type=int, default=30, help="bench: timed steps (default 30, as ember)")
    ap.add_argument("--warmup", type=int, default=3, help="bench: untimed warm-up steps (default 3)")
    ap.add_argument("--threads", type=int, help="CPU threads (default: train.threads, else all cores)")
    ap.add_argument("--device", help="cpu or cuda[:N] (default: the config's device); on CUDA every "
                    "timer read waits for the device (torch.cuda.synchronize)")
    ap.add_argument("--autocast", choices=["bf16"], help="forward pass and loss under torch.autocast in bf16")
    ap.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--quiet", action="store_true", help="train: no progress lines")
    ap.add_argument("--trace", action="store_true", help="train: add every step's loss and grad norm to the JSON")
    ap.add_argument("--ember", help="ember binary used to prepare BPE/translation token ids "
                    "(default: $EMBER_BIN, else ${CARGO_TARGET_DIR:-target}/release/ember)")
    ap.add_argument("--ember-run", metavar="DIR", help="read token ids from this Ember run directory")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        sys.exit("error: --steps must be at least 1 and --warmup at least 0")

    tree = load_config(args.config, args.set)
    set_device(args.device or str(tree.get("device", "cpu")))
    t = train_settings(tree)
    ev = Settings(tree.get("eval"), EVAL_DEFAULTS)
    threads = args.threads or t.threads or os.cpu_count() or 1
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(int(t.seed))  # dropout masks (Ember's own dropout stream is not reproduced)

    splits, translation = load_splits(args, tree)
    cfg = resolve_model(tree, splits, translation, t)
    model = Transformer(cfg)
    init_like_ember(model, int(t.seed))
    model.to(DEVICE)
    model.train()
    global AUTOCAST
    AUTOCAST = torch.bfloat16 if args.autocast == "bf16" else None
    if args.compile:
        model.compile()  # in place: the parameter names (and so the optimizer's groups) stay

    if args.params:
        out = dict(params=model.num_params(), vocab_size=cfg.vocab_size,
                   names=len(list(model.named_parameters())))
        print(json.dumps(out) if args.json else f"{args.config}: {out['params']} parameters "
              f"({out['names']} tensors, vocabulary {cfg.vocab_size})")
    elif args.bench:
        if DEVICE.type == "cuda":
            torch.cuda.reset_peak_memory_stats(DEVICE)
        r = bench(model, cfg, splits, translation, t, args.steps, args.warmup)
        r.update(autocast=args.autocast, compiled=args.compile)
        if args.json:
            print(json.dumps(r))
        else:
            print(f"{args.config}: {r['params']} params, {r['threads']} threads, {r['tokens_per_step']:.0f} tokens/step (PyTorch {torch.__version__})\n"
                  f"step {r['ms_per_step_median']:.1f} ms median (p10 {r['ms_per_step_p10']:.1f}, p90 {r['ms_per_step_p90']:.1f}) = "
                  f"forward {r['forward_ms']:.1f} + backward {r['backward_ms']:.1f} + optimizer {r['optimizer_ms']:.1f}\n"
                  f"{r['tokens_per_sec']:.0f} tokens/s | peak RSS {r['peak_rss_mib']:.0f} MiB "
                  f"({r['rss_after_import_mib']:.0f} MiB of it after importing PyTorch)")
    else:
        r = train(model, cfg, splits, translation, t, ev, args.quiet, args.trace)
        if args.json:
            print(json.dumps(r))
        else:
            print(f"final val loss {r['val_loss']:.4f} (ppl {r['val_ppl']:.2f}) after {r['steps']} steps; "
                  f"wall {r['wall_secs']:.1f} s (training steps {r['train_secs']:.1f} s)")


if __name__ == "__main__":
    main()
