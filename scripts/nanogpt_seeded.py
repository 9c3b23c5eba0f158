"""Runs nanoGPT's train.py under another seed, and optionally with rotary positions, changing
nothing in nanoGPT's files.

    cd NANOGPT_CHECKOUT && python .../scripts/nanogpt_seeded.py [--positions rope] SEED train.py [ARGS...]

train.py has no seed setting: it calls torch.manual_seed(1337 + seed_offset) once (seed_offset
is the DDP rank, 0 in a single process), and everything random after that (initial weights,
training batches, evaluation batches) comes from torch's generator. This wrapper shifts that one
call by SEED - 1, so seed 1 is nanoGPT exactly as published (1337) and seeds 2, 3 are 1338, 1339,
then runs train.py as `python train.py ARGS...` would.

--positions rope replaces GPT-2's learned position table with rotary embeddings as Ember applies
them (GPT-NeoX's "rotate half" pairing, theta 10000, on q and k of every head after the split
into heads, before the dot product): the wpe table is still created and drawn, so every other
weight gets the same initial values as in the published model, then zeroed and frozen (train.py's
configure_optimizers leaves frozen tensors out), and CausalSelfAttention.forward is replaced by
the same computation with q and k rotated.
"""

import os
import runpy
import sys

import torch
import torch.nn.functional as F


def rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: (B, heads, T, head_dim); dimension i pairs with i + head_dim/2 (rotate half)."""
    t, hs = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hs // 2, dtype=torch.float64) * 2.0 / hs)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def use_rope(theta: float = 10000.0) -> None:
    import model  # nanoGPT's model.py (train.py's folder is first on the path)

    published_init = model.GPT.__init__

    def init(self, config):
        published_init(self, config)
        wpe = self.transformer.wpe.weight
        with torch.no_grad():
            wpe.zero_()
        wpe.requires_grad_(False)

    def forward(self, x):
        b, t, c = x.size()
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        q, k = rotate(q, theta), rotate(k, theta)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))

    model.GPT.__init__ = init
    model.CausalSelfAttention.forward = forward


def run(seed: int, script: str, args: list[str], positions: str) -> None:
    seed_torch = torch.manual_seed
    seeded = []

    def shifted(value):
        seeded.append(value)
        return seed_torch(value + seed - 1)

    torch.manual_seed = shifted
    # As `python train.py` would have it: its folder first on the path (for `from model import
    # GPT`), its own name in argv[0] (configurator.py reads argv[1:]).
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    if positions == "rope":
        use_rope()
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    if len(seeded) != 1:
        sys.exit(f"nanogpt_seeded: {script} seeded torch {len(seeded)} times, expected once; "
                 "this wrapper does not know how to reseed it")


if __name__ == "__main__":
    argv = sys.argv[1:]
    positions = "learned"
    if argv[:1] == ["--positions"]:
        if len(argv) < 2 or argv[1] not in ("learned", "rope"):
            sys.exit("nanogpt_seeded: --positions takes learned (nanoGPT as published) or rope")
        positions, argv = argv[1], argv[2:]
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        sys.exit("usage: nanogpt_seeded.py [--positions learned|rope] SEED(>=1) train.py [ARGS...]")
    run(int(argv[0]), argv[1], argv[2:], positions)
