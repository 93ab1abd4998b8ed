"""Argument checks of the public functions: TypeError for a wrong type or dtype, ValueError for a
wrong value, each naming the argument. They run before any op, so fake tensors (torch.compile)
get the same errors as real ones; the C++ entry points check everything again.
"""

from __future__ import annotations

import math

import torch

from ._layout import HEAD_DIMS, RECIPES

LAYOUTS = ("bshd", "bhsd")
D_SOURCES = ("forward-o", "high-precision-o")
ROLES = ("q", "k", "v")
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CUDA_DTYPES = (torch.float16, torch.bfloat16)
QUANTIZE_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the quantizers' inputs

# Dimension names of q and of k/v per layout, for messages in the caller's terms.
_DIMS = {
    "bshd": ("(batch, seqlen_q, heads, head_dim)", "(batch, seqlen_k, kv_heads, head_dim)"),
    "bhsd": ("(batch, heads, seqlen_q, head_dim)", "(batch, kv_heads, seqlen_k, head_dim)"),
}


def check_layout(layout: object) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    return layout


def check_recipe(recipe: object) -> str:
    if not isinstance(recipe, str):
        raise TypeError(f"recipe: expected a str, got {type(recipe).__name__}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe: unknown recipe {recipe!r} (known: {', '.join(RECIPES)})")
    return recipe


def check_choice(value: object, name: str, choices: tuple) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def check_softmax_scale(softmax_scale: object) -> float:
    """None -> 0.0, which the C++ side resolves to 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(
            f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}"
        )
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale: expected a finite value > 0, got {softmax_scale}")
    return float(softmax_scale)


def _type_name(value: object) -> str:
    """The type as a user would write it: "int", "numpy.bool_", "torch.Tensor"."""
    t = type(value)
    if t.__module__ == "builtins":
        return t.__name__
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):
        return "numpy.bool_"  # numpy 2 names it "bool", which read "expected a bool, got bool"
    return f"{t.__module__.split('.')[0]}.{t.__qualname__}"


def check_bool(value: object, name: str) -> bool:
    # numpy.bool_ is refused, not converted: every caller passes the argument itself on.
    if not isinstance(value, bool):
        hint = f"; pass bool({name})" if _type_name(value) == "numpy.bool_" else ""
        raise TypeError(f"{name}: expected a bool, got {_type_name(value)}{hint}")
    return value


def check_tensor(t: object, name: str, rank: int, dims: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank} {dims}, got rank {t.dim()}")
    return t


def check_input_dtype(t: torch.Tensor, name: str) -> None:
    allowed = CUDA_DTYPES if t.device.type == "cuda" else CPU_DTYPES
    if t.dtype not in allowed:
        where = "CUDA" if t.device.type == "cuda" else "CPU"
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"{name}: dtype {t.dtype} is not supported on {where} (supported: {names})")


def check_device(t: torch.Tensor, name: str, like: torch.Tensor, like_name: str) -> None:
    if t.device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"{name}: device {t.device} is not supported (cpu or cuda)")
    if t.device != like.device:
        raise ValueError(f"{name}: on {t.device}, but {like_name} is on {like.device}")


def check_head_dim(d: int, name: str) -> None:
    if d not in HEAD_DIMS:
        supported = ", ".join(str(h) for h in HEAD_DIMS)
        raise ValueError(f"{name}: head_dim {d} is not supported (supported: {supported})")


def check_quantize_dtype(t: torch.Tensor, name: str) -> None:
    """The dtypes the operand quantizers take (quantize_qkv, quantize_q, the ring's shards)."""
    if t.device.type != "cuda" and t.dtype not in QUANTIZE_CPU_DTYPES:
        raise TypeError(
            f"{name}: dtype {t.dtype} is not supported by quantize_qkv on CPU "
            "(supported: float16, bfloat16, float32)"
        )


def check_tensor_scale(value: float | None, name: str) -> float:
    """A static NVFP4 encode scale: None -> 0.0 (computed per (batch, head))."""
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name}: expected a float or None, got {type(value).__name__}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name}: expected a finite value > 0 (None = computed), got {value}")
    return float(value)


def check_last_dim_contiguous(t: torch.Tensor, name: str) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension (head_dim) must be contiguous (stride 1), got stride "
            f"{t.stride(-1)}; call .contiguous() first"
        )


def check_qkv(q, k, v, layout: str) -> None:
    """q, k, v in `layout`: types, ranks, dtypes, devices, shapes, GQA and head_dim."""
    q_dims, kv_dims = _DIMS[layout]
    check_tensor(q, "q", 4, q_dims)
    check_tensor(k, "k", 4, kv_dims)
    check_tensor(v, "v", 4, kv_dims)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        check_device(t, name, q, "q")
        check_input_dtype(t, name)
        check_last_dim_contiguous(t, name)
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
    h = 2 if layout == "bshd" else 1  # the heads dimension
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k: expected batch {q.shape[0]} and head_dim {q.shape[3]} like q, got shape "
            f"{tuple(k.shape)} {kv_dims}"
        )
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)} like k, got {tuple(v.shape)}")
    heads, kv_heads = q.shape[h], k.shape[h]
    if kv_heads == 0 and heads > 0:
        raise ValueError(f"k: number of kv heads is 0 but q has {heads} heads")
    if kv_heads > 0 and heads % kv_heads != 0:
        raise ValueError(f"q/k: number of heads {heads} is not a multiple of kv heads {kv_heads}")
    check_head_dim(q.shape[3], "q")
