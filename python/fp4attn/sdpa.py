"""A drop-in torch.nn.functional.scaled_dot_product_attention that runs fp4attn.

    with fp4attn.sdpa.patch():                 # or fp4attn.sdpa.install() ... uninstall()
        image = pipe(prompt).images[0]         # every F.scaled_dot_product_attention call

scaled_dot_product_attention takes torch's arguments (names, order, defaults, keyword-only
`scale` and `enable_gqa` as in torch's schema) plus a keyword-only `recipe` (None: the default
recipe at each call, fp4attn.use_recipe). It runs fp4attn.attn_func where fp4attn computes what
torch's function defines, and torch's own function (captured at import, so that it still works
while patched in) everywhere else; fallback_counts() says how often each reason was taken.

Decisions read types, shapes, dtypes, devices and flags only, never a tensor's values: no host
sync, and torch.compile traces through them (counts included: it replays them on every call). CPU tensors run the golden model (the
library's rule: the bit-exact definition, slow). The output may be a non-contiguous view (of a
BSHD buffer, like torch's flash backend's).
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from . import _checks, _defaults, _layout
from ._native import engine_refusal
from .api import attn_func

# Every fallback calls this: the function F held when fp4attn.sdpa was first imported.
_TORCH_SDPA = F.scaled_dot_product_attention

# Why a call falls back to torch (the keys of fallback_counts()).
REASONS = {
    "argument": "q, k or v not a tensor, or a flag of another type (torch raises or converts)",
    "nested": "nested (ragged) tensors",
    "subclass": "a tensor subclass (DTensor, ...) outside torch.compile tracing",
    "attn_mask": "attn_mask is given (any mask, even an all-True one: its values are not read)",
    "dropout": "dropout_p != 0",
    "rank": "q, k, v of different ranks, or of rank < 2",
    "shape": "batch dims that differ (torch broadcasts them), or k and v differ before head_dim",
    "empty": "q or k has no elements",
    "head_dim_mismatch": "q, k, v head dims differ",
    "head_dim": "head_dim not one fp4attn runs (64, 128)",
    "gqa": "h != h_kv without enable_gqa, or h_kv not dividing h",
    "dtype": "q, k, v dtypes differ, or a dtype fp4attn does not run on their device",
    "device": "tensors on several devices, a device other than cpu/cuda, a GPU without the engine",
    "autocast": "autocast is on and would cast q, k, v to its dtype (torch computes in that one)",
    "recipe": "a recipe the GPU engine does not run (bf16) on CUDA tensors",
    "backward": "inputs that require grad for a recipe without a backward on their device",
    "scale": "a scale fp4attn refuses (<= 0, not finite, out of float32's range)",
}

_counts: collections.Counter = collections.Counter()
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# recipe.h: kGpuBackwardRecipes is kGpuRecipes, the engine's recipes; _C exports that one list.
_GPU_RECIPES = _layout.GPU_BACKWARD_RECIPES
_AUTOCAST_CASTS = (torch.float16, torch.bfloat16, torch.float32)


def fallback_counts() -> dict[str, int]:
    """Calls since reset_counts(): "calls" ran fp4attn, each key of REASONS fell back to torch."""
    return {"calls": _counts["calls"], **{reason: _counts[reason] for reason in REASONS}}


def reset_counts() -> None:
    _counts.clear()


@torch.compiler.assume_constant_result
def _engine_runs_on(index: int | None) -> bool:
    """Whether CUDA device `index` runs the engine (a CUDA build, an sm_90a GPU): a constant for
    torch.compile (it cannot change within a process)."""
    return _ask_engine(index)


def _ask_engine(index: int | None) -> bool:
    return engine_refusal(index) is None


def _device_reason(device: torch.device, dtype: torch.dtype, recipe: str, needs_grad: bool):
    """What keeps fp4attn from running `recipe` on `device` and `dtype` (a key of REASONS)."""
    if device.type == "cpu":  # the golden model: every recipe, forward and backward
        return None if dtype in _checks.CPU_DTYPES else "dtype"
    if device.type != "cuda":
        return "device"
    if dtype not in _checks.CUDA_DTYPES:
        return "dtype"
    if not _engine_runs_on(device.index):
        return "device"
    if recipe not in _GPU_RECIPES:
        return "recipe"
    if needs_grad and recipe not in _layout.GPU_BACKWARD_RECIPES:
        return "backward"
    return None


def _autocast_casts(device_type: str, dtype: torch.dtype) -> bool:
    """Whether autocast would run torch's SDPA in another dtype than the inputs' (it casts the
    16/32-bit floats; fp4attn's ops have no autocast rule and would keep theirs)."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return False
    return dtype in _AUTOCAST_CASTS and dtype != torch.get_autocast_dtype(device_type)


def _shape_reason(query, key, value, enable_gqa: bool):
    rank = query.dim()
    if rank < 2 or key.dim() != rank or value.dim() != rank:
        return "rank"
    if key.shape[:-1] != value.shape[:-1] or query.shape[:-3] != key.shape[:-3]:
        return "shape"
    if query.numel() == 0 or key.numel() == 0:
        return "empty"
    d = query.shape[-1]
    if key.shape[-1] != d or value.shape[-1] != d:
        return "head_dim_mismatch"
    if d not in _layout.HEAD_DIMS:
        return "head_dim"
    if rank >= 3:
        h, h_kv = query.shape[-3], key.shape[-3]
        if h != h_kv and (not enable_gqa or h % h_kv != 0):
            return "gqa"  # torch raises without enable_gqa (or broadcasts h_kv == 1)
    return None


def fallback_reason(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
    recipe: str | None = None,
) -> str | None:
    """Why scaled_dot_product_attention would call torch's function on these arguments (a key of
    REASONS), or None when it runs fp4attn. Raises only for a bad `recipe`."""
    recipe = _defaults.resolve(recipe)
    tensors = (query, key, value)
    if (
        not all(isinstance(t, torch.Tensor) for t in tensors)
        or not isinstance(is_causal, bool)
        or not isinstance(enable_gqa, bool)
        or isinstance(dropout_p, bool)
        or not isinstance(dropout_p, (int, float))
    ):
        return "argument"
    if any(t.is_nested for t in tensors):
        return "nested"
    # Traced tensors (FakeTensor, FunctionalTensor) are subclasses too, and run fp4attn's ops.
    if not torch.compiler.is_compiling() and any(type(t) not in _PLAIN_TENSORS for t in tensors):
        return "subclass"
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p != 0:
        return "dropout"
    reason = _shape_reason(query, key, value, enable_gqa)
    if reason is not None:
        return reason
    if not query.dtype == key.dtype == value.dtype:
        return "dtype"
    if not query.device == key.device == value.device:
        return "device"
    if _autocast_casts(query.device.type, query.dtype):
        return "autocast"
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    reason = _device_reason(query.device, query.dtype, recipe, needs_grad)
    if reason is not None:
        return reason
    try:
        _checks.check_softmax_scale(scale)
    except (TypeError, ValueError):
        return "scale"
    return None


def attn_top_left(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    recipe: str | None = None,
    return_lse: bool = False,
    layout: str = "bshd",
    smooth_k: bool = False,
):
    """attn_func with causal TOP-LEFT aligned (torch SDPA's and SageAttention's convention):
    query i sees keys 0..i, also when s_q != s_k (attn_func's causal is bottom-right aligned;
    the two agree when s_q == s_k). Arguments and result as attn_func's."""
    if causal is not True:  # attn_func checks everything, `causal` included
        return attn_func(
            q, k, v, softmax_scale=softmax_scale, causal=causal, recipe=recipe,
            return_lse=return_lse, layout=layout, smooth_k=smooth_k,
        )  # fmt: skip
    _checks.check_layout(layout)
    _checks.check_qkv(q, k, v, layout)
    seq = 1 if layout == "bshd" else 2
    s_q, s_k = q.shape[seq], k.shape[seq]
    run = functools.partial(
        attn_func, softmax_scale=softmax_scale, recipe=recipe, return_lse=True, layout=layout,
        smooth_k=smooth_k,
    )  # fmt: skip
    if s_q <= s_k:
        # Only the first s_q keys are visible, and on them both alignments agree.
        o, lse = run(q, k.narrow(seq, 0, s_q), v.narrow(seq, 0, s_q), causal=True)
    else:
        # Queries s_k.. see every key: a causal square, then full attention for the rest.
        o_head, lse_head = run(q.narrow(seq, 0, s_k), k, v, causal=True)
        o_tail, lse_tail = run(q.narrow(seq, s_k, s_q - s_k), k, v, causal=False)
        o, lse = torch.cat((o_head, o_tail), seq), torch.cat((lse_head, lse_tail), 2)
    return (o, lse) if return_lse else o


def _as_bhsd(t: torch.Tensor, rank: int) -> torch.Tensor:
    """[..., h, s, d] (or [s, d]) as [b, h, s, d], its head_dim contiguous as fp4attn needs."""
    heads = t.shape[-3] if rank >= 3 else 1
    t = t.reshape(-1, heads, t.shape[-2], t.shape[-1])  # a view for SDPA's usual layouts
    return t if t.stride(-1) == 1 else t.contiguous()


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
    recipe: str | None = None,
):
    """torch.nn.functional.scaled_dot_product_attention on fp4attn's `recipe` (None: the
    default recipe, fp4attn.use_recipe): torch's result up to the recipe's quantization.

    Falls back to torch's function for anything fp4attn does not compute as torch defines it
    (REASONS; fallback_counts() counts them). is_causal is top-left aligned as torch's, also when
    s_q != s_k (see attn_top_left). Returns q's shape with value's head_dim, in q's dtype;
    possibly a non-contiguous view.
    """
    recipe = _defaults.resolve(recipe)
    reason = fallback_reason(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa,
        recipe=recipe,
    )  # fmt: skip
    if reason is not None:
        _counts[reason] += 1
        return _TORCH_SDPA(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    _counts["calls"] += 1
    rank = query.dim()
    o = attn_top_left(
        _as_bhsd(query, rank), _as_bhsd(key, rank), _as_bhsd(value, rank), scale, is_causal,
        recipe, layout="bhsd",
    )  # fmt: skip
    return o.reshape(query.shape)  # value's head_dim is q's here


# ---- patching torch.nn.functional -------------------------------------------------------------


def _shim(recipe: str | None) -> Callable:
    """The function to install: the shim itself, or one bound to `recipe` (checked now)."""
    if recipe is None:
        return scaled_dot_product_attention
    recipe = _checks.check_recipe(recipe)

    def bound(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
              enable_gqa=False):  # fmt: skip
        return scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
            enable_gqa=enable_gqa, recipe=recipe,
        )  # fmt: skip

    bound.__doc__ = f"fp4attn.sdpa.scaled_dot_product_attention with recipe={recipe!r}."
    bound.fp4attn_recipe = recipe
    return bound


_replaced: list[Callable] = []  # what install() replaced (one entry at most)


def install(recipe: str | None = None) -> None:
    """Replaces torch.nn.functional.scaled_dot_product_attention with the shim until uninstall()
    (recipe None: the default recipe at each call). Code that looks the function up at call time
    (F.scaled_dot_product_attention) gets the shim; a module that imported the function by name
    before (`from torch.nn.functional import scaled_dot_product_attention`) keeps torch's.
    Installing again only changes the recipe."""
    shim = _shim(recipe)
    if not _replaced:
        _replaced.append(F.scaled_dot_product_attention)
    F.scaled_dot_product_attention = shim


def uninstall() -> bool:
    """Puts back what install() replaced; False when nothing was installed."""
    if not _replaced:
        return False
    F.scaled_dot_product_attention = _replaced.pop()
    return True


@contextlib.contextmanager
def patch(recipe: str | None = None) -> Iterator[Callable]:
    """install() for a block: the shim inside it, and whatever F held before after it (nested
    patch() blocks restore each other). Yields the installed function."""
    shim = _shim(recipe)
    previous = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = shim
    try:
        yield shim
    finally:
        F.scaled_dot_product_attention = previous


__all__ = [
    "REASONS",
    "attn_top_left",
    "fallback_counts",
    "fallback_reason",
    "install",
    "patch",
    "reset_counts",
    "scaled_dot_product_attention",
    "uninstall",
]
