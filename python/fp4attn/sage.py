"""A drop-in SageAttention `sageattn` that runs fp4attn:

    from fp4attn import sageattn               # instead of: from sageattention import sageattn
    o = sageattn(q, k, v, tensor_layout="NHD", is_causal=False)

sageattn's arguments, names, order and defaults (SageAttention's sageattention/core.py), plus a
keyword-only `recipe` (None: the default recipe at each call, fp4attn.use_recipe). Conventions
kept: tensor_layout "HND" [b, h, s, d] or "NHD" [b, s, h, d]; is_causal top-left aligned (query i
sees keys 0..i, also when s_q != s_k); K smoothed by default (fp4attn's smooth_k); head dims
below 128 zero-padded to fp4attn's next one (64 or 128) with sm_scale from the real one; lse
float32 [b, h_q, s_q] in both layouts, natural log, of sm_scale * q.k (the smoothing term added
back). Unlike SageAttention, CPU tensors run too (the golden model), and a keyword argument is
honoured or refused, never ignored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import _checks, _layout
from ._native import UnsupportedError
from .sdpa import attn_top_left

_LAYOUTS = {"HND": "bhsd", "NHD": "bshd"}
_DIMS = {"HND": "(batch, heads, seqlen, head_dim)", "NHD": "(batch, seqlen, heads, head_dim)"}

# Keyword arguments of the kernels sageattn dispatches to, other than smooth_k: fp4attn's recipe
# decides how Q/K/V are quantized and accumulated, so only the values SageAttention's Hopper
# kernel runs with by default are accepted (they describe no change to fp4attn).
_FIXED_KWARGS = {
    "attn_mask": None,
    "qk_quant_gran": "per_thread",
    "pv_accum_dtype": "fp32+fp32",
    "smooth_v": False,
    "quantization_backend": "triton",
}


def _smooth_k(kwargs: dict) -> bool:
    """smooth_k from sageattn's **kwargs; every other one checked against _FIXED_KWARGS."""
    smooth_k = _checks.check_bool(kwargs.pop("smooth_k", True), "smooth_k")
    for name, value in kwargs.items():
        if name not in _FIXED_KWARGS:
            known = ", ".join(("smooth_k", *_FIXED_KWARGS))
            raise TypeError(f"sageattn: unexpected keyword argument {name!r} (known: {known})")
        fixed = _FIXED_KWARGS[name]
        if isinstance(value, torch.Tensor) or value != fixed or type(value) is not type(fixed):
            what = "a mask" if isinstance(value, torch.Tensor) else repr(value)
            raise UnsupportedError(
                f"{name}: fp4attn's sageattn supports only {fixed!r} (got {what}); the recipe "
                "sets how Q, K, V are quantized and accumulated"
            )
    return smooth_k


def _check_sm_scale(sm_scale: object) -> float | None:
    if sm_scale is None:
        return None
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale: expected a float or None, got {type(sm_scale).__name__}")
    return _checks.check_float32(
        sm_scale, "sm_scale", _checks.FLOAT32_TINY, _checks.SOFTMAX_SCALE_MAX,
        "None = 1/sqrt(head_dim)",
    )  # fmt: skip


def _padded_head_dim(q, k, v) -> int:
    """The head dim fp4attn runs these at: theirs, or the next of HEAD_DIMS (zero padding)."""
    d = q.shape[3]
    for t, name in ((k, "k"), (v, "v")):
        if t.shape[3] != d:
            raise ValueError(f"{name}: expected head_dim {d} like q, got {t.shape[3]}")
    if d in _layout.HEAD_DIMS or d == 0:
        return d  # 0: attn_func's head_dim check refuses it
    larger = [h for h in _layout.HEAD_DIMS if h > d]
    if not larger:
        supported = ", ".join(str(h) for h in _layout.HEAD_DIMS)
        raise UnsupportedError(
            f"q: head_dim {d} is not supported (fp4attn runs {supported}; smaller ones are "
            "zero-padded)"
        )
    return min(larger)


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
    *,
    recipe: str | None = None,
    **kwargs,
):
    """SageAttention's sageattn on fp4attn's `recipe` (None: the default recipe).

    q [b, h, s_q, d] ("HND") or [b, s_q, h, d] ("NHD"), k and v likewise with h_kv heads
    (h % h_kv == 0), d <= 128. Returns o in q's layout and dtype (possibly a non-contiguous
    view), and with return_lse also lse float32 [b, h, s_q] (natural log). kwargs: smooth_k
    (default True); attn_mask=None, qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32",
    smooth_v=False, quantization_backend="triton" are accepted with these values only.
    """
    if not isinstance(tensor_layout, str) or tensor_layout not in _LAYOUTS:
        raise ValueError(f"tensor_layout: expected 'HND' or 'NHD', got {tensor_layout!r}")
    _checks.check_bool(is_causal, "is_causal")
    _checks.check_bool(return_lse, "return_lse")
    scale = _check_sm_scale(sm_scale)
    smooth_k = _smooth_k(dict(kwargs))
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _checks.check_tensor(t, name, 4, _DIMS[tensor_layout])
    d = q.shape[3]
    d_run = _padded_head_dim(q, k, v)
    if d_run != d:
        q, k, v = (F.pad(t, (0, d_run - d)) for t in (q, k, v))  # zeros change no q.k
        scale = 1 / math.sqrt(d) if scale is None else scale
    out = attn_top_left(
        q, k, v, softmax_scale=scale, causal=is_causal, recipe=recipe, return_lse=return_lse,
        layout=_LAYOUTS[tensor_layout], smooth_k=smooth_k,
    )  # fmt: skip
    if d_run == d:
        return out
    if return_lse:
        return out[0][..., :d], out[1]
    return out[..., :d]


__all__ = ["sageattn"]
