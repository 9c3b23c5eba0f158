#!/usr/bin/env python3
"""Checks an `ember export --format hf` directory against Ember's own logits.

Loads OUT with transformers' AutoModelForCausalLM and AutoTokenizer (nothing Ember-specific),
checks that the tokenizer gives Ember's token ids for the reference text, runs the model on
those ids, and compares its logits with the ones `ember export --reference-logits` wrote. Exits
non-zero when the tokens differ or the largest absolute logit difference exceeds --tol.

    python -m pip install torch transformers safetensors
    target/release/ember export runs/my-lm OUT --reference-logits OUT/ember-logits.json
    scripts/check-hf-export.py OUT OUT/ember-logits.json [--tol 1e-4] [--json RESULT.json]
"""
import argparse
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="the directory ember export wrote")
    ap.add_argument("reference", help="the JSON file of --reference-logits")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest allowed |logit difference|")
    ap.add_argument("--json", help="also write the result to this JSON file")
    args = ap.parse_args()

    ref = json.load(open(args.reference))
    tokens = ref["tokens"]
    expected = torch.tensor(ref["logits"], dtype=torch.float32)

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    hf_tokens = tok(ref["text"], add_special_tokens=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
        generated = model.generate(torch.tensor([tokens[:4]]), max_new_tokens=8, do_sample=False)
    diff = (logits - expected).abs().max().item()
    result = {
        "model_dir": args.model_dir,
        "architecture": model.config.architectures[0],
        "params": sum(p.numel() for p in model.parameters()),
        "tokens": len(tokens),
        "tokenizer_matches": hf_tokens == tokens,
        "max_abs_logit_diff": diff,
        "max_abs_logit": expected.abs().max().item(),
        "argmax_agreement": (logits.argmax(-1) == expected.argmax(-1)).float().mean().item(),
        "greedy_continuation": tok.decode(generated[0][4:]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)
    ok = True
    if not result["tokenizer_matches"]:
        print(f"FAIL: transformers' tokenizer gives {hf_tokens[:20]}..., Ember gave {tokens[:20]}...", file=sys.stderr)
        ok = False
    if not diff <= args.tol:
        print(f"FAIL: max |logit difference| {diff:.3g} > {args.tol:g}", file=sys.stderr)
        ok = False
    if ok:
        print(f"OK: {result['architecture']} logits equal Ember's to {diff:.3g} (tolerance {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
