#!/usr/bin/env python3
"""Checks `model.init_from` against transformers, without network.

Builds small random models with transformers -- Llama (tied and untied, grouped-query and
multi-head), Mistral, Qwen2 (biases on q, k and v) and Qwen3 (heads wider than hidden/heads, an
embedding padded past the tokenizer, a bf16 checkpoint in shards) -- each with a byte-level BPE tokenizer of its own, saves
them as Hugging Face folders, imports each into Ember and compares:

  1. logits: Ember's imported model (crates/import/examples/hf_logits.rs) against transformers',
     on the validation text's first tokens;
  2. loss: the training loss `ember train` logs at steps 1 and 2 (AdamW with weight decay and
     gradient clipping, every window of the training text in each batch) against the same two
     steps in PyTorch;
  3. logits after training: the step-2 checkpoint exported back out (`ember export
     --reference-logits`, and the export loaded by transformers) against the PyTorch model after
     the same two updates.

Exits non-zero when a difference exceeds its tolerance (--logit-tol, --loss-tol, --trained-tol)
or Ember's tokenizer gives other ids than transformers'. Trained logits get a looser tolerance:
Adam's update is lr·m/(sqrt(v) + eps), each gradient element divided by its own size, so where an
element is near zero, the two frameworks' rounding differences in it become a visible part of lr
in that weight's update; the script reports the largest weight difference after the two updates
next to the logits'.

    python -m pip install torch transformers safetensors tokenizers
    cargo build --release && cargo build --release -p ember-import --example hf_logits
    scripts/check-hf-import.py [--ember target/release/ember]
        [--hf-logits target/release/examples/hf_logits] [--out DIR] [--json RESULT.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import tokenizers
import torch
import transformers
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen3Config)

BLOCK = 32
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 3e-3, (0.9, 0.98), 1e-8, 0.1, 1.0

SENTENCES = [
    "The river ran quietly past the mill, and the miller counted his sacks of grain.",
    "A small boat drifted toward the harbour while gulls circled over the fishing nets.",
    "She opened the old book, read the first page twice, and smiled at the strange map.",
    "Numbers like 42, 1024 and 3.14159 appear in every programmer's notes sooner or later.",
    "When the rain stopped, the children ran outside to splash in the puddles again.",
    "Trains leave the station at seven, nine and eleven; the last one is always late.",
]

SIZES = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1,
             attention_dropout=0.0)

# name, config class, settings, save dtype, shard size, extra embedding rows
CASES = [
    ("llama-tied-gqa", LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                         rope_theta=10000.0), torch.float32, None, 0),
    ("llama-untied-mha", LlamaConfig, dict(num_key_value_heads=4, tie_word_embeddings=False,
                                           rope_theta=500000.0), torch.float32, None, 0),
    ("mistral-untied-gqa", MistralConfig, dict(num_key_value_heads=2, tie_word_embeddings=False,
                                               sliding_window=None, rope_theta=1e6),
     torch.float32, None, 0),
    ("qwen2-tied-gqa", Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                         rope_theta=1e6), torch.float32, None, 0),
    ("qwen2-untied-mha-bf16", Qwen2Config, dict(num_key_value_heads=4, tie_word_embeddings=False),
     torch.bfloat16, None, 0),
    ("qwen3-tied-wide-heads", Qwen3Config, dict(num_key_value_heads=2, head_dim=32,
                                                tie_word_embeddings=True, rope_theta=1e6),
     torch.float32, None, 19),
    ("qwen3-untied-bf16-sharded", Qwen3Config, dict(num_key_value_heads=1, head_dim=16,
                                                    tie_word_embeddings=False),
     torch.bfloat16, "60KB", 0),
]


def make_tokenizer(work):
    """A GPT-2-style byte-level BPE with <|endoftext|> as its only special token."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(SENTENCES * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def write_corpus(work):
    train = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(0, 9)) + "\n"
    valid = " ".join(SENTENCES[(i * 5) % len(SENTENCES)] for i in range(0, 4)) + "\n"
    paths = {}
    for name, text in [("train", train), ("valid", valid)]:
        paths[name] = os.path.join(work, f"{name}.txt")
        with open(paths[name], "w") as f:
            f.write(text)
    return paths


def build_model(name, cls, settings, dtype, shard, extra_rows, tok, work):
    torch.manual_seed(sum(map(ord, name)))
    cfg = cls(vocab_size=len(tok) + extra_rows, bos_token_id=None,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SIZES, **settings)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        # Gains away from 1 and biases away from 0 (transformers starts them there), so that
        # one read from the wrong place cannot go unnoticed.
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    folder = os.path.join(work, name)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(dtype).save_pretrained(folder, **kwargs)
    tok.save_pretrained(folder)
    # The reference is what is on disk, read back in f32 (bf16 weights widen exactly).
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return folder, ref


def ember_config(folder, paths, batch_size):
    return f"""model:
  init_from: "{folder}"
data:
  corpus: {{ kind: text, train_files: ["{paths['train']}"], val_files: ["{paths['valid']}"] }}
train:
  steps: 2
  seed: 1
  lr: {LR}
  schedule: constant
  warmup_steps: 0
  beta1: {BETAS[0]}
  beta2: {BETAS[1]}
  adam_eps: {EPS}
  weight_decay: {WEIGHT_DECAY}
  clip_grad_norm: {CLIP}
  batch_size: {batch_size}
  block_size: {BLOCK}
  windows: sweep
  log_every: 1
eval:
  every: 0
log:
  tensorboard: false
"""


def torch_steps(model, stream):
    """Two AdamW steps on every window of `stream`, as Ember's sweep batches them; returns the two
    losses. Ember decays matrices other than the embedding and output layer."""
    n = (len(stream) - 1) // BLOCK
    x = torch.tensor([stream[w * BLOCK:(w + 1) * BLOCK] for w in range(n)])
    y = torch.tensor([stream[w * BLOCK + 1:(w + 1) * BLOCK + 1] for w in range(n)])
    decay, plain = [], []
    for pname, p in model.named_parameters():
        embedding = "embed_tokens" in pname or "lm_head" in pname
        (decay if p.dim() >= 2 and not embedding else plain).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": plain, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    model.train()
    losses = []
    for _ in range(2):
        opt.zero_grad()
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses, n


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return done.stdout


def check_case(case, tok, paths, args, work):
    name, cls, settings, dtype, shard, extra_rows = case
    folder, ref = build_model(name, cls, settings, dtype, shard, extra_rows, tok, work)
    raw = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    encode = lambda path: raw.encode(open(path).read(), add_special_tokens=False).ids
    train_ids, valid_ids = encode(paths["train"]), encode(paths["valid"])
    probe = valid_ids[:48]

    # 1. The imported model's logits.
    ember = json.loads(run([args.hf_logits, folder] + [str(i) for i in probe]))
    ember_logits = torch.tensor(ember["logits"])
    with torch.no_grad():
        hf_logits = ref(torch.tensor([probe])).logits[0]
    logit_diff = (ember_logits - hf_logits).abs().max().item()

    # 2. Two training steps.
    windows = (len(train_ids) - 1) // BLOCK
    cfg_path = os.path.join(work, f"{name}.yaml")
    with open(cfg_path, "w") as f:
        f.write(ember_config(folder, paths, windows))
    run_dir = os.path.join(work, f"run-{name}")
    run([args.ember, "train", cfg_path, "--run-dir", run_dir, "--quiet", "--json"])
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ember_losses = [m["loss"] for m in metrics if m.get("kind") == "train"][:2]
    torch_losses, n = torch_steps(ref, train_ids)
    assert n == windows
    loss_diff = max(abs(a - b) for a, b in zip(ember_losses, torch_losses))

    # 3. Exported back out after the two updates.
    out = os.path.join(work, f"out-{name}")
    reference = os.path.join(work, f"out-{name}.json")
    text = raw.decode(probe)
    run([args.ember, "export", run_dir, out, "--reference-logits", reference, "--reference-text", text])
    exported = json.load(open(reference))
    tokens_match = exported["tokens"] == probe
    with torch.no_grad():
        trained_logits = ref(torch.tensor([exported["tokens"]])).logits[0]
    trained_diff = (torch.tensor(exported["logits"]) - trained_logits).abs().max().item()
    roundtrip = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        out_diff = (roundtrip(torch.tensor([probe])).logits[0] - trained_logits).abs().max().item()
    # How far the trained weights are apart (see above).
    ours, theirs = load_file(os.path.join(out, "model.safetensors")), ref.state_dict()
    weight_diff = max((ours[k] - theirs[k]).abs().max().item() for k in ours)

    return {
        "model": name,
        "architecture": ref.config.architectures[0],
        "params": sum(p.numel() for p in ref.parameters()),
        "vocab": f"{ref.config.vocab_size} rows, {len(tok)} tokens",
        "saved_as": f"{str(dtype).removeprefix('torch.')}" + (f", shards of {shard}" if shard else ""),
        "tokenizer_matches": tokens_match,
        "max_abs_logit_diff": logit_diff,
        "max_abs_logit": hf_logits.abs().max().item(),
        "argmax_agreement": (ember_logits.argmax(-1) == hf_logits.argmax(-1)).float().mean().item(),
        "windows_per_batch": windows,
        "ember_losses": ember_losses,
        "torch_losses": torch_losses,
        "max_abs_loss_diff": loss_diff,
        "max_abs_trained_logit_diff": trained_diff,
        "max_abs_trained_weight_diff": weight_diff,
        "exported_vs_torch_trained_logit_diff": out_diff,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default="target/release/ember")
    ap.add_argument("--hf-logits", default="target/release/examples/hf_logits")
    ap.add_argument("--out", help="keep the models and runs here (default: a temporary directory)")
    ap.add_argument("--logit-tol", type=float, default=1e-4, help="largest allowed |logit difference|")
    ap.add_argument("--loss-tol", type=float, default=1e-4, help="largest allowed |loss difference|")
    ap.add_argument("--trained-tol", type=float, default=2e-3,
                    help="largest allowed |logit difference| after the two updates")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or tmp
        os.makedirs(work, exist_ok=True)
        tok = make_tokenizer(work)
        paths = write_corpus(work)
        results = [check_case(case, tok, paths, args, work) for case in CASES]

    summary = {
        "results": results,
        "logit_tolerance": args.logit_tol,
        "loss_tolerance": args.loss_tol,
        "trained_logit_tolerance": args.trained_tol,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        json.dump(summary, open(args.json, "w"), indent=2)
    failed = []
    for r in results:
        checks = [
            (r["tokenizer_matches"], "Ember's tokenizer gives other ids"),
            (r["max_abs_logit_diff"] <= args.logit_tol, f"logits differ by {r['max_abs_logit_diff']:.3g}"),
            (r["max_abs_loss_diff"] <= args.loss_tol, f"losses differ by {r['max_abs_loss_diff']:.3g}"),
            (r["max_abs_trained_logit_diff"] <= args.trained_tol,
             f"trained logits differ by {r['max_abs_trained_logit_diff']:.3g}"),
            (r["exported_vs_torch_trained_logit_diff"] <= args.trained_tol,
             f"the export back out differs by {r['exported_vs_torch_trained_logit_diff']:.3g}"),
        ]
        failed += [f"{r['model']}: {why}" for ok, why in checks if not ok]
    for f in failed:
        print(f"FAIL: {f}", file=sys.stderr)
    if not failed:
        worst = max(r["max_abs_logit_diff"] for r in results)
        worst_loss = max(r["max_abs_loss_diff"] for r in results)
        worst_trained = max(r["max_abs_trained_logit_diff"] for r in results)
        print(f"OK: {len(results)} models; imported logits within {worst:.3g}, losses of two training steps "
              f"within {worst_loss:.3g}, logits after them within {worst_trained:.3g} "
              f"(tolerances {args.logit_tol:g}, {args.loss_tol:g}, {args.trained_tol:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
