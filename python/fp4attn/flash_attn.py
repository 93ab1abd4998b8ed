"""FlashAttention-2's Python API over fp4attn: `from fp4attn.flash_attn import flash_attn_func` in
place of `from flash_attn import flash_attn_func`.

Mirrors flash_attn/flash_attn_interface.py of FlashAttention 2.8.4 (Dao-AILab/flash-attention at
0251105a2fb1, the version in flash_attn/__init__.py): every public function keeps its parameter
names, order and defaults, and gains one keyword-only `recipe=None` (None: the process default,
fp4attn.set_default_recipe / use_recipe).

Each argument either works or is refused by name: at its default it is always accepted; a value
fp4attn does not implement raises fp4attn.UnsupportedError (dropout_p > 0, window_size other than
(-1, -1), softcap other than 0, alibi_slopes, rotary_cos/rotary_sin, cache_batch_idx,
cache_leftpad, flash_attn_varlen_func's block_table), never a silent change. deterministic=True is
accepted on CPU (the golden model is deterministic), and on CUDA wherever no backward can follow
or torch.use_deterministic_algorithms(True) is on (the GPU backward's fixed-order dQ); otherwise it
is refused. Results are fp4attn.attn_func's (attn_varlen_func's, decode's) bit for bit.

return_attn_probs=True returns (out, softmax_lse, S_dmask) as FA2 does: softmax_lse float32
[batch, heads, seqlen_q] ([heads, total_q] for varlen, natural log, +inf for a row without keys),
S_dmask FA2's empty tensor (shape (0,), q's dtype), what FA2 returns without dropout.

flash_attn_with_kvcache reads fp4attn's quantized paged cache: k_cache must be a
fp4attn.PagedKVCache (v_cache None or the same object) and block_table is required; see its
docstring.
"""

from __future__ import annotations

import torch

from . import _checks
from . import _fa_common as _fa
from ._native import UnsupportedError
from .api import attn_func
from .paged import PagedKVCache
from .varlen import attn_varlen_func


def _check_options(dropout_p, window_size, softcap, alibi_slopes, deterministic, inputs) -> None:
    _fa.check_dropout(dropout_p)
    _fa.check_window(window_size)
    _fa.check_softcap(softcap)
    _fa.refuse_given(alibi_slopes, "alibi_slopes", "an ALiBi bias")
    _fa.check_deterministic(deterministic, inputs)


def _unpack(packed: object, name: str, rank: int, axis: int, parts: int, dims: str):
    """Views of a packed tensor's parts (qkv: 3, kv: 2) along `axis`; gradients reach it."""
    _checks.check_tensor(packed, name, rank, dims)
    if packed.shape[axis] != parts:
        raise ValueError(
            f"{name}: expected {parts} at dimension {axis} of {dims}, got shape "
            f"{tuple(packed.shape)}"
        )
    return packed.unbind(axis)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """fp4attn.attn_func with FA2's arguments: q [batch, seqlen_q, heads, head_dim], k and v
    [batch, seqlen_k, kv_heads, head_dim]; causal bottom-right aligned. Returns out, or with
    return_attn_probs (out, softmax_lse [batch, heads, seqlen_q], S_dmask empty)."""
    _check_options(dropout_p, window_size, softcap, alibi_slopes, deterministic, (q, k, v))
    _checks.check_bool(return_attn_probs, "return_attn_probs")
    out = attn_func(
        q, k, v, softmax_scale, causal, recipe=recipe, return_lse=return_attn_probs
    )  # fmt: skip
    return _fa.fa2_result(out, q, return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """flash_attn_func on qkv [batch, seqlen, 3, heads, head_dim] (views, no copy)."""
    q, k, v = _unpack(qkv, "qkv", 5, 2, 3, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, recipe=recipe,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """flash_attn_func on q and kv [batch, seqlen_k, 2, kv_heads, head_dim] (views, no copy)."""
    k, v = _unpack(kv, "kv", 5, 2, 2, "(batch, seqlen_k, 2, kv_heads, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, recipe=recipe,
    )  # fmt: skip


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    recipe: str | None = None,
):
    """fp4attn.attn_varlen_func with FA2's arguments: q [total_q, heads, head_dim], k and v
    [total_k, kv_heads, head_dim], cu_seqlens_q/k int32 [batch + 1] (read on the host, as
    attn_varlen_func reads them). Returns out, or with return_attn_probs (out, softmax_lse
    [heads, total_q], S_dmask empty). block_table (paged K/V as plain tensors) is refused:
    fp4attn's paged cache is quantized; paged prefill is fp4attn.decode with cu_seqlens_q."""
    _check_options(dropout_p, window_size, softcap, alibi_slopes, deterministic, (q, k, v))
    _checks.check_bool(return_attn_probs, "return_attn_probs")
    if block_table is not None:
        raise UnsupportedError(
            "block_table: paged K/V given as plain tensors is not supported: fp4attn's paged "
            "cache is quantized (fp4attn.PagedKVCache); for paged prefill append the keys with "
            "fp4attn.append_kv and call fp4attn.decode(q, cache, block_tables, seq_lens, "
            "cu_seqlens_q=...)"
        )
    out = attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        recipe=recipe, return_lse=return_attn_probs,
    )  # fmt: skip
    return _fa.fa2_result(out, q, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """flash_attn_varlen_func on qkv [total, 3, heads, head_dim] (views, no copy)."""
    q, k, v = _unpack(qkv, "qkv", 4, 1, 3, "(total, 3, heads, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs, recipe=recipe,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    recipe: str | None = None,
):
    """flash_attn_varlen_func on q and kv [total_k, 2, kv_heads, head_dim] (views, no copy)."""
    k, v = _unpack(kv, "kv", 4, 1, 2, "(total_k, 2, kv_heads, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        recipe=recipe,
    )  # fmt: skip


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: PagedKVCache,
    v_cache: PagedKVCache | None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = _fa.NO_WINDOW,
    softcap: float = _fa.NO_SOFTCAP,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = _fa.NO_SPLITS,
    return_softmax_lse: bool = False,
    *,
    recipe: str | None = None,
):
    """Decode over fp4attn's paged cache with FA2's arguments.

    k_cache: a fp4attn.PagedKVCache (its NVFP4/FP8 codes are the cache; a plain tensor is refused
    with TypeError), v_cache None or the same object; block_table int32 [batch, max_pages]
    (required); cache_seqlens an int or int32 [batch] (None: each sequence spans its whole table
    row). New k, v [batch, seqlen_new, kv_heads, head_dim] are appended in place at positions
    cache_seqlens .. cache_seqlens + seqlen_new - 1 (fp4attn.append_kv, the slots computed on the
    device from block_table), then q [batch, seqlen_q, heads, head_dim] attends over
    cache_seqlens + seqlen_new tokens (fp4attn.decode; causal bottom-right). num_splits: 0 lets
    the decode pick its split-KV count, n >= 1 forces it (DecodePlan). rotary_interleaved only
    applies with rotary_cos/rotary_sin, which are refused. recipe: None only (the cache's format
    sets the numerics). Returns out, or (out, softmax_lse [batch, heads, seqlen_q]). A new token
    beyond its table row raises on CPU; on CUDA it is skipped and cache.check_errors() reports it.
    """
    # Arguments left at their defaults need no check (a decode step's host time is the cost).
    untouched = (
        recipe is None and rotary_cos is None and rotary_sin is None and cache_batch_idx is None
        and cache_leftpad is None and alibi_slopes is None and rotary_interleaved is True
        and window_size is _fa.NO_WINDOW and softcap is _fa.NO_SOFTCAP
    )  # fmt: skip
    if not untouched:
        _fa.check_no_recipe(recipe)
        _fa.refuse_given(rotary_cos, "rotary_cos", "rotary embedding")
        _fa.refuse_given(rotary_sin, "rotary_sin", "rotary embedding")
        _checks.check_bool(rotary_interleaved, "rotary_interleaved")
        _fa.refuse_given(cache_batch_idx, "cache_batch_idx", "indexing the cache by batch")
        _fa.refuse_given(cache_leftpad, "cache_leftpad", "a left-padded cache")
        _fa.check_window(window_size)
        _fa.check_softcap(softcap)
        _fa.refuse_given(alibi_slopes, "alibi_slopes", "an ALiBi bias")
    _checks.check_bool(return_softmax_lse, "return_softmax_lse")
    return _fa.kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, "block_table", softmax_scale,
        causal, num_splits, return_softmax_lse,
    )  # fmt: skip


__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
