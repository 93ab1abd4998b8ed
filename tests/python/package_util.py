"""Shared helpers of the fp4attn package tests (test_package_*.py)."""

import math

import torch

import fp4attn
import fp4attn._layout

# docs/numerics.md §6, gaussian column: rel-L2 of O against float64 attention (b=1, h=4,
# s=1024, d=128). The tests use smaller shapes, so they allow a margin on top.
DOCUMENTED_REL_L2 = {
    "bf16": 0.002,
    "fp8": 0.054,
    "fp8-fast": 0.057,
    "int8": 0.040,  # FA3's shape on the H200 at 033caf8 (bench/results/fwd-int8.json)
    "int8-fast": 0.044,
    "nvfp4": 0.133,
    "nvfp4-hx": 0.177,
    "mxfp4": 0.169,
    "nvfp4-fast": 0.134,
    "nvfp4-all": 0.186,
    "fp4-direct": 0.338,
}
MARGIN = 1.25


def tolerance(recipe: str) -> float:
    return DOCUMENTED_REL_L2[recipe] * MARGIN + 0.005


def qkv(b=1, s_q=256, s_k=None, h=4, h_kv=None, d=64, dtype=torch.float32, device="cpu", seed=0):
    """Gaussian BSHD q, k, v with BF16-exact values (what the GPU reads)."""
    g = torch.Generator().manual_seed(seed)
    s_k = s_q if s_k is None else s_k
    h_kv = h if h_kv is None else h_kv

    def make(s, heads):
        x = torch.randn(b, s, heads, d, generator=g).to(torch.bfloat16)
        return x.to(dtype).to(device)

    return make(s_q, h), make(s_k, h_kv), make(s_k, h_kv)


def sdpa_bshd(q, k, v, causal=False, scale=None):
    """float32 SDPA on BSHD inputs, causal bottom-right aligned (FlashAttention's convention)."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    h, h_kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // h_kv, dim=1)
    v = v.repeat_interleave(h // h_kv, dim=1)
    mask = None
    if causal:
        s_q, s_k = q.shape[2], k.shape[2]
        i = torch.arange(s_q).unsqueeze(1)
        j = torch.arange(s_k).unsqueeze(0)
        mask = j <= i + s_k - s_q
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return o.transpose(1, 2)


def rel_l2(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm())


def lse_ref(q, k, causal=False, scale=None):
    """float64 log-sum-exp [b, h, s_q] of the scores."""
    q, k = q.double().transpose(1, 2), k.double().transpose(1, 2)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s_q, s_k = q.shape[2], k.shape[2]
        i = torch.arange(s_q).unsqueeze(1)
        j = torch.arange(s_k).unsqueeze(0)
        s = s.masked_fill(j > i + s_k - s_q, float("-inf"))
    return torch.logsumexp(s, dim=-1)


# The recipes quantize_qkv takes: all but the int8 ones, which smooth K (QuantizedQKV carries no
# K mean yet; test_package_api.py checks the refusal).
QUANTIZED_RECIPES = tuple(r for r in fp4attn.RECIPES if r not in fp4attn._layout.SMOOTHS_K)
