"""Ember's transformer (crates/model/src) in plain PyTorch, nanoGPT style.

One module per Ember struct, with the same attribute names, so `named_parameters()` yields
exactly the names Ember saves in model.safetensors (`decoder.layers.0.self_attn.q_proj.weight`,
...). That buys three things: the parameter count can be compared name for name, Ember's
AdamW decay groups (decided by name) carry over, and `init_like_ember` can reproduce Ember's
initial values bit for bit (they are drawn from a SplitMix64 stream keyed by seed and name).

What is Ember's, point by point:
* pre-norm blocks `x + attn(norm(x))`, `x + mlp(norm(x))`, a final norm per stack;
* RMSNorm `x / sqrt(mean(x²) + eps) · w` or LayerNorm with bias; no biases in linear layers;
* GELU (erf) or SwiGLU MLP; dropout on embeddings and on every residual branch's output;
* rotary positions (rotate-half) on self-attention only, after QK-norm;
* QK-norm per head over head_dim: rmsnorm / layernorm (gains shared across heads; the key
  LayerNorm of cross-attention has no bias, see attention.rs) or l2 (unit q and k, logits
  scaled by a learnable scalar g instead of 1/sqrt(d));
* grouped-query attention (query head h reads key/value head h // (n_heads / n_kv_heads));
* tied embeddings (seq2seq always shares one embedding between encoder and decoder);
* init: normal(0, init_std), residual output projections init_std / sqrt(branches in stack).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# `enable_gqa` (PyTorch >= 2.5) lets SDPA share key/value heads without copying them.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


class ModelConfig:
    """The `model:` section with Ember's defaults (crates/model/src/config.rs)."""

    DEFAULTS = dict(
        arch=None, vocab_size=None, d_model=None, n_layers=None, n_encoder_layers=None,
        n_decoder_layers=None, n_heads=None, n_kv_heads=None, d_ff=None, mlp="swiglu",
        norm="rmsnorm", norm_eps=1e-5, rope_theta=10000.0, max_seq_len=512, qk_norm="none",
        qk_norm_init_scale=None, qk_norm_length=None, dropout=0.0, attn_dropout=0.0,
        tie_embeddings=True, init_std=0.02,
    )
    REQUIRED = ("arch", "d_model", "n_heads", "d_ff")
    CHOICES = dict(arch=("lm", "seq2seq"), mlp=("swiglu", "gelu"), norm=("rmsnorm", "layernorm"),
                   qk_norm=("none", "layernorm", "rmsnorm", "l2"))

    def __init__(self, section: dict):
        unknown = sorted(set(section) - set(self.DEFAULTS))
        if unknown:
            raise ValueError(f"model.{unknown[0]}: unknown key (the reference knows {', '.join(self.DEFAULTS)})")
        for k, v in self.DEFAULTS.items():
            setattr(self, k, section.get(k, v))
        for k in self.REQUIRED:
            if getattr(self, k) is None:
                raise ValueError(f"model.{k}: required")
        for k, allowed in self.CHOICES.items():
            if getattr(self, k) not in allowed:
                raise ValueError(f"model.{k}: {getattr(self, k)!r} is not one of {', '.join(allowed)}")
        if self.arch == "lm":
            if self.n_layers is None or self.n_encoder_layers is not None or self.n_decoder_layers is not None:
                raise ValueError("model.n_layers: arch lm needs n_layers (and no n_encoder/decoder_layers)")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("model.n_heads: d_model / n_heads must be an even integer (rotary pairs)")
        if self.n_heads % self.kv_heads:
            raise ValueError("model.n_kv_heads: must divide n_heads")
        if self.qk_norm != "l2" and (self.qk_norm_init_scale is not None or self.qk_norm_length is not None):
            raise ValueError("model.qk_norm_init_scale: applies to qk_norm: l2 only")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def encoder_layers(self) -> int:
        return 0 if self.arch == "lm" else (self.n_encoder_layers or self.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.arch == "lm" else (self.n_decoder_layers or self.n_layers)

    def l2_init_scale(self) -> float:
        """g0 = log2(L² − L) (Henry et al. 2020) unless given."""
        if self.qk_norm_init_scale is not None:
            return float(self.qk_norm_init_scale)
        n = max(self.qk_norm_length or self.max_seq_len, 2)
        return math.log2(n * n - n)


def _param(shape, init) -> nn.Parameter:
    """A parameter tagged with Ember's init rule: ('normal', std) or ('const', value)."""
    p = nn.Parameter(torch.empty(shape))
    p.ember_init = init
    return p


class Linear(nn.Module):
    """y = x Wᵀ, no bias; W is (out, in) like Ember's."""

    def __init__(self, d_in: int, d_out: int, std: float):
        super().__init__()
        self.weight = _param((d_out, d_in), ("normal", std))

    def forward(self, x):
        return F.linear(x, self.weight)


class Norm(nn.Module):
    def __init__(self, kind: str, dim: int, eps: float, bias: bool = True):
        super().__init__()
        self.kind, self.dim, self.eps = kind, dim, eps
        self.weight = _param((dim,), ("const", 1.0))
        if kind == "layernorm" and bias:
            self.bias = _param((dim,), ("const", 0.0))
        else:
            self.bias = None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
        if hasattr(F, "rms_norm"):  # PyTorch >= 2.4
            return F.rms_norm(x, (self.dim,), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Rotary(nn.Module):
    """Rotate-half RoPE: dimension i pairs with i + d/2, angle pos · θ^(−2i/d). Tables are
    computed in float64 and rounded once, as rope.rs does."""

    def __init__(self, head_dim: int, max_len: int, theta: float):
        super().__init__()
        half = head_dim // 2
        inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)  # both halves carry the same angles
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        self.max_len = max_len

    def forward(self, x):  # x: (B, H, T, d)
        t = x.shape[-2]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} is beyond model.max_seq_len = {self.max_len}")
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * self.cos[:t] + rotated * self.sin[:t]


def l2_normalize(x, eps: float):
    # eps inside the square root, as layers.rs does (F.normalize clamps the norm instead).
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class Attention(nn.Module):
    """Self-attention (with rotary positions) or cross-attention (without)."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None, out_std: float):
        super().__init__()
        d, hd, h, kv = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.kv_heads
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, hd
        self.q_proj = Linear(d, h * hd, cfg.init_std)
        self.k_proj = Linear(d, kv * hd, cfg.init_std)
        self.v_proj = Linear(d, kv * hd, cfg.init_std)
        self.o_proj = Linear(h * hd, d, out_std)
        self.qk_norm, self.eps = cfg.qk_norm, cfg.norm_eps
        if cfg.qk_norm in ("rmsnorm", "layernorm"):
            self.q_norm = Norm(cfg.qk_norm, hd, cfg.norm_eps, bias=True)
            # Without rotation a key bias shifts all logits of a query alike (softmax cancels
            # it), so Ember gives cross-attention's key LayerNorm no bias.
            self.k_norm = Norm(cfg.qk_norm, hd, cfg.norm_eps, bias=rotary is not None)
        elif cfg.qk_norm == "l2":
            self.qk_scale = _param((1,), ("const", cfg.l2_init_scale()))
        self.rotary = rotary  # shared by every self-attention; holds no parameters
        self.attn_dropout, self.dropout = cfg.attn_dropout, cfg.dropout

    def _heads(self, x, n):
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)

    def _normalize(self, x, norm):
        if self.qk_norm == "l2":
            return l2_normalize(x, self.eps)
        return norm(x) if norm is not None else x

    def forward(self, x, memory=None, mask=None, causal=False):
        """x (B, T, D) attends to itself, or to `memory` (B, S, D) for cross-attention.
        `mask` is a boolean (B, 1, 1, S) key mask (True = attend)."""
        src = x if memory is None else memory
        q = self._heads(self.q_proj(x), self.n_heads)
        k = self._heads(self.k_proj(src), self.n_kv_heads)
        v = self._heads(self.v_proj(src), self.n_kv_heads)
        q = self._normalize(q, getattr(self, "q_norm", None))
        k = self._normalize(k, getattr(self, "k_norm", None))
        if self.rotary is not None:  # QK-norm first, then rotation (Qwen3, OLMo 2)
            q, k = self.rotary(q), self.rotary(k)
        scale = None  # SDPA's default 1/sqrt(head_dim)
        if self.qk_norm == "l2":
            q, scale = q * self.qk_scale, 1.0  # logits bounded by |g|
        gqa = {}
        if self.n_kv_heads != self.n_heads:
            if _SDPA_GQA:
                gqa = {"enable_gqa": True}
            else:
                group = self.n_heads // self.n_kv_heads
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
            dropout_p=self.attn_dropout if self.training else 0.0, **gqa,
        )
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        return F.dropout(self.o_proj(y), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, cfg: ModelConfig, down_std: float):
        super().__init__()
        self.kind = cfg.mlp
        if cfg.mlp == "swiglu":
            self.gate_proj = Linear(cfg.d_model, cfg.d_ff, cfg.init_std)
        self.up_proj = Linear(cfg.d_model, cfg.d_ff, cfg.init_std)
        self.down_proj = Linear(cfg.d_ff, cfg.d_model, down_std)
        self.dropout = cfg.dropout

    def forward(self, x):
        if self.kind == "swiglu":
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            h = F.gelu(self.up_proj(x))  # exact (erf) GELU
        return F.dropout(self.down_proj(h), self.dropout, self.training)


class Layer(nn.Module):
    """An encoder layer, a decoder layer (with cross-attention) or an LM layer."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary, out_std: float, cross: bool):
        super().__init__()
        n = lambda: Norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn_norm = n()
        self.self_attn = Attention(cfg, rotary, out_std)
        if cross:
            self.cross_attn_norm = n()
            self.cross_attn = Attention(cfg, None, out_std)
        self.mlp_norm = n()
        self.mlp = Mlp(cfg, out_std)

    def forward(self, x, self_mask=None, causal=False, memory=None, memory_mask=None):
        x = x + self.self_attn(self.attn_norm(x), mask=self_mask, causal=causal)
        if memory is not None:
            x = x + self.cross_attn(self.cross_attn_norm(x), memory=memory, mask=memory_mask)
        return x + self.mlp(self.mlp_norm(x))


class Stack(nn.Module):
    """Layers plus a final norm. Residual output projections start at init_std / sqrt(R), R
    the residual branches in the stack (2 per layer, 3 with cross-attention): GPT-2's rule."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary, n_layers: int, cross: bool):
        super().__init__()
        out_std = cfg.init_std / math.sqrt(n_layers * (3 if cross else 2))
        self.layers = nn.ModuleList(Layer(cfg, rotary, out_std, cross) for _ in range(n_layers))
        self.norm = Norm(cfg.norm, cfg.d_model, cfg.norm_eps)

    def forward(self, x, **kw):
        for layer in self.layers:
            x = layer(x, **kw)
        return self.norm(x)


class Transformer(nn.Module):
    """Decoder-only LM (`arch: lm`) or pre-norm encoder–decoder (`arch: seq2seq`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.rotary = Rotary(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed.weight.ember_init = ("normal", cfg.init_std)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab_size, cfg.init_std)
        if cfg.arch == "seq2seq":
            self.encoder = Stack(cfg, self.rotary, cfg.encoder_layers, cross=False)
        self.decoder = Stack(cfg, self.rotary, cfg.decoder_layers, cross=cfg.arch == "seq2seq")

    def _embed(self, ids):
        return F.dropout(self.embed(ids), self.cfg.dropout, self.training)

    def _logits(self, h):
        w = self.embed.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return F.linear(h, w)

    def forward(self, tokens, src=None, src_mask=None):
        """LM: logits (B, T, V) for tokens (B, T). seq2seq: `tokens` is the teacher-forced
        decoder input, `src` (B, S) the source and `src_mask` (B, S) True at real tokens."""
        if self.cfg.arch == "lm":
            return self._logits(self.decoder(self._embed(tokens), causal=True))
        key_mask = src_mask[:, None, None, :]
        memory = self.encoder(self._embed(src), self_mask=key_mask)
        h = self.decoder(self._embed(tokens), causal=True, memory=memory, memory_mask=key_mask)
        return self._logits(h)

    def num_params(self) -> int:
        # parameters() yields a tied weight once, as Ember's ParamStore counts it.
        return sum(p.numel() for p in self.parameters())


# ---------------------------------------------------------------------------------------------
# Ember's initialisation, value for value (crates/model/src/params.rs, rng.rs)
# ---------------------------------------------------------------------------------------------

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _splitmix_outputs(seed: int, count: int) -> np.ndarray:
    """The first `count` outputs of SplitMix64(seed), vectorised: output k mixes seed + k·γ."""
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + k * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def ember_normal(seed: int, name: str, n: int, std: float) -> np.ndarray:
    """normal(0, std) values of parameter `name`: its stream is SplitMix64(seed ^ fnv1a(name))
    with one output discarded, and each normal is a Box–Muller pair (u1, u2)."""
    out = _splitmix_outputs((seed ^ _fnv1a64(name.encode())) & 0xFFFFFFFFFFFFFFFF, 1 + 2 * n)[1:]
    u = (out >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    u1, u2 = 1.0 - u[0::2], u[1::2]
    return std * (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2))


@torch.no_grad()
def init_like_ember(model: nn.Module, seed: int) -> None:
    for name, p in model.named_parameters():
        kind, value = p.ember_init
        if kind == "const":
            p.fill_(value)
        else:
            values = ember_normal(seed, name, p.numel(), value).reshape(tuple(p.shape))
            p.copy_(torch.from_numpy(values).float())
