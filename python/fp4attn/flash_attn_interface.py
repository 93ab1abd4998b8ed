"""FlashAttention-3's Python API over fp4attn: `from fp4attn.flash_attn_interface import
flash_attn_func` in place of FA3's `from flash_attn_interface import flash_attn_func`.

Mirrors hopper/flash_attn_interface.py of FlashAttention-3 3.0.0 (Dao-AILab/flash-attention at
0251105a2fb1; the file as of 0f82fead0b2d): flash_attn_func, flash_attn_qkvpacked_func,
flash_attn_varlen_func and flash_attn_with_kvcache keep their parameter names, order and defaults
and return conventions (that revision's flash_attn_func returns out, or (out, softmax_lse) with
return_attn_probs; flash_attn_with_kvcache with return_softmax_lse (out, softmax_lse, out_accum,
softmax_lse_accum), the last two empty here: fp4attn combines its splits in the kernel). Each
gains one keyword-only `recipe=None` (None: the process default, fp4attn.set_default_recipe).

Each argument either works or is refused by name: at its default it is always accepted; a value
fp4attn does not implement raises fp4attn.UnsupportedError (qv, window_size other than (-1, -1),
attention_chunk, softcap, seqused_q/k, rotary arguments, cache_batch_idx, cache_leftpad,
scheduler_metadata, sm_margin other than 0, num_splits > 1 in the dense functions). pack_gqa
(None, True, False) is a scheduling hint, accepted with no effect on the result. deterministic=True
holds on CPU, on CUDA without a backward or under torch.use_deterministic_algorithms(True), and is
refused otherwise. 16-bit results are fp4attn.attn_func's (attn_varlen_func's, decode's) bit for
bit; softmax_lse float32 [batch, heads, seqlen_q] ([heads, total_q] for varlen), natural log.

FP8: q, k, v float8_e4m3fn with q_descale/k_descale/v_descale float32 [batch, kv_heads] (None: 1)
run on the fp8 recipe's operands built from those codes and descales, without re-quantization
(only the 1-byte codes move into the operand layouts), and return bfloat16, as FA3 does. Another
recipe with FP8 inputs is refused; descales with 16-bit inputs are refused (FA3 ignores them).
FP8 inputs have no backward (FA3's neither).
"""

from __future__ import annotations

import torch

from . import _checks
from . import _fa_common as _fa
from .api import attn_func
from .paged import PagedKVCache
from .varlen import attn_varlen_func


def _check_options(qv, window_size, attention_chunk, softcap, num_splits, pack_gqa, deterministic,
                   sm_margin, return_attn_probs, inputs) -> None:  # fmt: skip
    _fa.refuse_given(qv, "qv", "a second query operand (qv)")
    _fa.check_window(window_size)
    _fa.check_zero(attention_chunk, "attention_chunk", "chunked attention")
    _fa.check_softcap(softcap)
    _fa.check_dense_splits(num_splits)
    _fa.check_pack_gqa(pack_gqa)
    _fa.check_deterministic(deterministic, inputs)
    _fa.check_zero(sm_margin, "sm_margin", "leaving SMs free (sm_margin)")
    _checks.check_bool(return_attn_probs, "return_attn_probs")


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """fp4attn.attn_func with FA3's arguments: q [batch, seqlen_q, heads, head_dim], k and v
    [batch, seqlen_k, kv_heads, head_dim]; causal bottom-right aligned. float8_e4m3fn inputs run on
    the fp8 operands of their codes and descales (bfloat16 out). Returns out, or with
    return_attn_probs (out, softmax_lse [batch, heads, seqlen_q])."""
    _check_options(qv, window_size, attention_chunk, softcap, num_splits, pack_gqa,
                   deterministic, sm_margin, return_attn_probs, (q, k, v))  # fmt: skip
    descales = (q_descale, k_descale, v_descale)
    if _fa.is_fp8(q):
        return _fa.attn_fp8(q, k, v, descales, softmax_scale, causal, recipe, return_attn_probs)
    _fa.refuse_descales(descales)
    return attn_func(q, k, v, softmax_scale, causal, recipe=recipe, return_lse=return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: int | None = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """flash_attn_func on qkv [batch, seqlen, 3, heads, head_dim], or [batch, seqlen, num_heads_q
    + 2 * kv_heads, head_dim] with num_heads_q (views, no copy)."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv: expected a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(
                f"qkv: expected 3 at dimension 2 of (batch, seqlen, 3, heads, head_dim), got "
                f"shape {tuple(qkv.shape)}"
            )
        if num_heads_q is not None and num_heads_q != qkv.shape[3]:
            raise ValueError(
                f"num_heads_q: {num_heads_q} differs from the {qkv.shape[3]} heads of qkv (rank 5)"
            )
        q, k, v = qkv.unbind(2)
    elif qkv.dim() == 4:
        if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int):
            raise TypeError(
                "num_heads_q: expected an int with qkv of rank 4 (batch, seqlen, num_heads_q + "
                f"2 * kv_heads, head_dim), got {_checks._type_name(num_heads_q)}"
            )
        kv_heads = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q <= 0 or kv_heads <= 0 or num_heads_q + 2 * kv_heads != qkv.shape[2]:
            raise ValueError(
                f"num_heads_q: {num_heads_q} does not split the {qkv.shape[2]} heads of qkv into "
                "num_heads_q + 2 * kv_heads"
            )
        q, k, v = qkv.split([num_heads_q, kv_heads, kv_heads], dim=2)
    else:
        raise ValueError(
            "qkv: expected rank 5 (batch, seqlen, 3, heads, head_dim) or rank 4 (batch, seqlen, "
            f"num_heads_q + 2 * kv_heads, head_dim), got rank {qkv.dim()}"
        )
    return flash_attn_func(
        q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size,
        attention_chunk, softcap, 1, None, deterministic, sm_margin, return_attn_probs,
        recipe=recipe,
    )  # fmt: skip


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """fp4attn.attn_varlen_func with FA3's arguments: q [total_q, heads, head_dim], k and v
    [total_k, kv_heads, head_dim], cu_seqlens_q/k int32 [batch + 1] (read on the host, as
    attn_varlen_func reads them). float8_e4m3fn inputs: each sequence on the fp8 operands of its
    codes and its row of the descales (bfloat16 out). Returns out, or with return_attn_probs
    (out, softmax_lse [heads, total_q])."""
    _fa.refuse_given(seqused_q, "seqused_q", "a used length per sequence (seqused_q)")
    _fa.refuse_given(seqused_k, "seqused_k", "a used length per sequence (seqused_k)")
    _check_options(qv, window_size, attention_chunk, softcap, num_splits, pack_gqa,
                   deterministic, sm_margin, return_attn_probs, (q, k, v))  # fmt: skip
    descales = (q_descale, k_descale, v_descale)
    if _fa.is_fp8(q):
        return _fa.attn_fp8_varlen(
            q, k, v, (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k), descales,
            softmax_scale, causal, recipe, return_attn_probs,
        )  # fmt: skip
    _fa.refuse_descales(descales)
    return attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        recipe=recipe, return_lse=return_attn_probs,
    )  # fmt: skip


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: PagedKVCache,
    v_cache: PagedKVCache | None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    rotary_seqlens: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = _fa.NO_WINDOW,
    attention_chunk: int = _fa.NO_CHUNK,
    softcap: float = _fa.NO_SOFTCAP,
    rotary_interleaved: bool = True,
    scheduler_metadata: torch.Tensor | None = None,
    num_splits: int = _fa.NO_SPLITS,
    pack_gqa: bool | None = None,
    sm_margin: int = _fa.NO_MARGIN,
    return_softmax_lse: bool = False,
    *,
    recipe: str | None = None,
):
    """Decode over fp4attn's paged cache with FA3's arguments.

    k_cache: a fp4attn.PagedKVCache (a plain tensor is refused with TypeError: the cache is
    quantized), v_cache None or the same object; page_table int32 [batch, max_pages] (required);
    cache_seqlens an int or int32 [batch] (None: each sequence spans its whole table row). q
    [batch, seqlen_q, heads, head_dim], or [total_q, heads, head_dim] with cu_seqlens_q int32
    [batch + 1] (max_seqlen_q: accepted, an int or None; the decode reads the offsets on the
    device). New k, v [batch, seqlen_new, kv_heads, head_dim], or [total_new, kv_heads, head_dim]
    with cu_seqlens_k_new, are appended in place after each sequence's cached tokens
    (fp4attn.append_kv, slots computed on the device), then q attends over them too
    (fp4attn.decode, causal bottom-right). num_splits: 0 lets the decode pick, n >= 1 forces it.
    Descales: None only (the cache holds its own scales). recipe: None only. Returns out, or
    (out, softmax_lse, out_accum, softmax_lse_accum) with the last two empty.
    """
    # Arguments left at their defaults need no check (a decode step's host time is the cost).
    untouched = (
        recipe is None and qv is None and rotary_cos is None and rotary_sin is None
        and rotary_seqlens is None and cache_batch_idx is None and cache_leftpad is None
        and q_descale is None and k_descale is None and v_descale is None
        and max_seqlen_q is None and scheduler_metadata is None and pack_gqa is None
        and rotary_interleaved is True and window_size is _fa.NO_WINDOW
        and softcap is _fa.NO_SOFTCAP and attention_chunk is _fa.NO_CHUNK
        and sm_margin is _fa.NO_MARGIN
    )  # fmt: skip
    if not untouched:
        _fa.check_no_recipe(recipe)
        _fa.refuse_given(qv, "qv", "a second query operand (qv)")
        for value, name in ((rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin"),
                            (rotary_seqlens, "rotary_seqlens")):  # fmt: skip
            _fa.refuse_given(value, name, "rotary embedding")
        _checks.check_bool(rotary_interleaved, "rotary_interleaved")
        _fa.refuse_given(cache_batch_idx, "cache_batch_idx", "indexing the cache by batch")
        _fa.refuse_given(cache_leftpad, "cache_leftpad", "a left-padded cache")
        for value, name in ((q_descale, "q_descale"), (k_descale, "k_descale"),
                            (v_descale, "v_descale")):  # fmt: skip
            _fa.refuse_given(value, name, "a descale over fp4attn's quantized cache")
        if max_seqlen_q is not None and (
            isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int)
        ):
            raise TypeError(
                f"max_seqlen_q: expected an int or None, got {type(max_seqlen_q).__name__}"
            )
        if max_seqlen_q is not None and max_seqlen_q < 0:
            raise ValueError(f"max_seqlen_q: expected a value >= 0, got {max_seqlen_q}")
        _fa.check_window(window_size)
        _fa.check_zero(attention_chunk, "attention_chunk", "chunked attention")
        _fa.check_softcap(softcap)
        _fa.refuse_given(
            scheduler_metadata, "scheduler_metadata", "FA3's scheduler metadata (a DecodePlan is "
            "fp4attn's plan)"
        )  # fmt: skip
        _fa.check_pack_gqa(pack_gqa)
        _fa.check_zero(sm_margin, "sm_margin", "leaving SMs free (sm_margin)")
    _checks.check_bool(return_softmax_lse, "return_softmax_lse")
    out = _fa.kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, page_table, "page_table", softmax_scale,
        causal, num_splits, return_softmax_lse, cu_seqlens_q, cu_seqlens_k_new,
    )  # fmt: skip
    if not return_softmax_lse:
        return out
    o, lse = out
    # FA3's split partials (out_accum, softmax_lse_accum): empty, as FA3's when it does not split.
    return o, lse, *(torch.empty((0,), dtype=torch.float32, device=o.device) for _ in range(2))


__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
]
