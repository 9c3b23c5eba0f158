#!/usr/bin/env python3
"""Writes a randomly initialised Hugging Face model folder in the exact shape of a published
small model, for measuring what fine-tuning it with `model.init_from` costs without downloading
it (README, "Fine-tuning a downloaded model").

The config.json is the published model's (sizes, RoPE, tied embeddings, Qwen3's 128-wide heads);
the weights are transformers' random initialisation, saved in bf16 as the published ones are;
the tokenizer is a byte-level BPE trained on --text (as many merges as the text gives, up to the
model's vocabulary: the embedding keeps all its rows).

    python -m pip install torch transformers safetensors tokenizers
    scripts/random-hf-model.py smollm2-135m OUT --text data/tinyshakespeare/input.txt
    scripts/random-hf-model.py qwen3-1.7b OUT --text ... --config-only   # for the memory check
"""
import argparse

import tokenizers
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen3Config)

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M
    "smollm2-135m": lambda: LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
        initializer_range=0.041666666666666664, bos_token_id=0, eos_token_id=0),
    # Qwen/Qwen2.5-0.5B: biases on q, k and v (Ember's `qkv_bias`)
    "qwen2.5-0.5b": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, initializer_range=0.02,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151643),
    # Qwen/Qwen3-0.6B-Base
    "qwen3-0.6b": lambda: Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=None, eos_token_id=0),
    # Qwen/Qwen3-1.7B-Base: too large to fine-tune in 24 GiB; with --config-only, for seeing the
    # memory check refuse it before any weight is read
    "qwen3-1.7b": lambda: Qwen3Config(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=None, eos_token_id=0),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--text", required=True, help="text to train the byte-level tokenizer on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config-only", action="store_true",
                    help="write config.json and the tokenizer, no weights")
    args = ap.parse_args()

    cfg = SHAPES[args.shape]()
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([args.text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    assert len(fast) <= cfg.vocab_size

    fast.save_pretrained(args.out)
    if args.config_only:
        cfg.save_pretrained(args.out)
        print(f"{args.out}: {args.shape}'s config.json (no weights), tokenizer of {len(fast)} tokens")
        return
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: random {args.shape} ({params:,} parameters, bf16), tokenizer of {len(fast)} tokens")


if __name__ == "__main__":
    main()
