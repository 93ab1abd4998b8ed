"""Varlen batches in flash_attn_varlen_func's convention: packed sequences q [total_q, h, d],
k/v [total_k, h_kv, d] and cumulative offsets cu_seqlens_q/k [batch + 1] (int32).

This first version runs attn_func on each sequence (a batch of one, over views of the packed
tensors), so each sequence gets its own scales exactly as a batch entry does, and the result of a
sequence does not depend on the others. The offsets are read on the host (one device-to-host
copy when they live on the GPU; a graph break under torch.compile). An in-kernel varlen schedule
is planned (docs/kernels/fwd_sm90.md).
"""

from __future__ import annotations

import torch

from . import _checks, _defaults
from .api import attn_func


def _offsets(cu: object, name: str, total: int, q: torch.Tensor) -> list[int]:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(
            f"{name}: expected a 1-D tensor of batch + 1 offsets, got {tuple(cu.shape)}"
        )
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected int32 (or int64) offsets, got {cu.dtype}")
    _checks.check_device(cu, name, q, "q")  # flash_attn_varlen_func's rule too
    offsets = [int(x) for x in cu.tolist()]
    if offsets[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {offsets[0]}")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ValueError(f"{name}: offsets must not decrease (entry {i})")
    if offsets[-1] > total:
        raise ValueError(f"{name}: last offset {offsets[-1]} exceeds the {total} packed tokens")
    return offsets


def _packed(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(
            f"{name}: expected rank 3 (total_tokens, heads, head_dim), got rank {t.dim()}"
        )
    return t


def attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    recipe: str | None = None,
    return_lse: bool = False,
):
    """Attention over packed sequences i = tokens [cu_seqlens[i], cu_seqlens[i + 1]).

    q [total_q, h, d], k and v [total_k, h_kv, d] (dtypes and devices as attn_func), offsets of
    batch + 1 entries starting at 0, on q's device. max_seqlen_q/k are accepted for
    flash_attn_varlen_func compatibility and checked when given. causal is bottom-right aligned
    per sequence. Returns o [total_q, h, d] (tokens past cu_seqlens_q[-1] are 0), and with
    return_lse also lse float32 [h, total_q] (natural log; +inf for rows without keys),
    FlashAttention's varlen layout.
    """
    q, k, v = _packed(q, "q"), _packed(k, "k"), _packed(v, "v")
    if v.shape != k.shape:  # each sequence's slice of v would be taken at k's offsets
        raise ValueError(f"v: expected shape {tuple(k.shape)} like k, got {tuple(v.shape)}")
    for t, name in ((k, "k"), (v, "v")):
        _checks.check_device(t, name, q, "q")
    _checks.check_softmax_scale(softmax_scale)
    _checks.check_bool(causal, "causal")
    _checks.check_bool(return_lse, "return_lse")
    recipe = _defaults.resolve(recipe)
    cq = _offsets(cu_seqlens_q, "cu_seqlens_q", q.shape[0], q)
    ck = _offsets(cu_seqlens_k, "cu_seqlens_k", k.shape[0], q)
    if len(cq) != len(ck):
        raise ValueError(
            f"cu_seqlens_k: {len(ck) - 1} sequences, but cu_seqlens_q has {len(cq) - 1}"
        )
    for name, offsets, bound in (
        ("max_seqlen_q", cq, max_seqlen_q),
        ("max_seqlen_k", ck, max_seqlen_k),
    ):
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise TypeError(f"{name}: expected an int or None, got {type(bound).__name__}")
        longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
        if longest > bound:
            raise ValueError(f"{name}: {bound} is shorter than the longest sequence ({longest})")
    o = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), dtype=torch.float32, device=q.device)
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        out = attn_func(
            q[None, q0:q1],
            k[None, k0:k1],
            v[None, k0:k1],
            softmax_scale=softmax_scale,
            causal=causal,
            recipe=recipe,
            return_lse=return_lse,
        )
        if return_lse:
            out, seq_lse = out
            lse[:, q0:q1] = seq_lse[0]
        o[q0:q1] = out[0]
    return (o, lse) if return_lse else o
