"""Argument checks of the public functions: TypeError for a wrong type or dtype, ValueError for a
wrong value, each naming the argument. They run before any op, so fake tensors (torch.compile)
get the same errors as real ones; the C++ entry points check everything again.
"""

from __future__ import annotations

import math
import struct

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


# ---- Python floats that cross into float32 ------------------------------------------------------
# The C++ entry points and the kernels take these scalars as float32 (the CPU golden model reads
# some as float64, the GPU always as float32), so each is checked in the float32 it becomes: a
# value that rounds to inf, to 0 (which means "computed" or "the default" past the border) or to a
# subnormal is refused, never converted silently. A scale's range is the one the library computes
# itself for finite inputs, less the subnormals (docs/numerics.md §9).

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)  # 2^-126, the smallest normal float32
# softmax_scale: the kernels' factor softmax_scale * log2(e) is a float32.
SOFTMAX_SCALE_MAX = FLOAT32_MAX / math.log2(math.e)
_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
# A static NVFP4 encode scale s_enc: fp4attn computes 6 * top / amax_tensor clamped to FLT_MAX
# (quantize.h nvfp4_tensor_scale; top 448, or 384 = kRestrictedScaleMax for the restricted rule),
# so no finite tensor gets one below 6 * 384 / FLT_MAX = 6.8e-36; below 2.4e-38 the operand
# factor 8 / s_enc overflows float32 and every output is NaN.
NVFP4_ENCODE_SCALE_RANGE = (6 * 384 / FLOAT32_MAX, FLOAT32_MAX)
# The FP8 paged cache's decode scale (x = e4m3 * scale, calibrated as amax / 448): e4m3 * scale
# stays finite up to FLT_MAX / 448.
FP8_DECODE_SCALE_RANGE = (FLOAT32_TINY, FLOAT32_MAX / _E4M3_MAX)


def _as_float32(value: float) -> float:
    """value rounded to float32 (RNE, as a C++ static_cast<float>), +-inf when it overflows."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # struct refuses finite doubles beyond float32's range
        return math.copysign(math.inf, value)


def check_float32(
    value: float,
    name: str,
    lo: float,
    hi: float,
    alternative: str | None = None,
    expected: str = "a finite value > 0",
) -> float:
    """The one check of a Python number (a float64) that becomes a float32 past the border: the
    float32 it rounds to must lie in [lo, hi] (lo >= FLOAT32_TINY, so that nothing becomes 0, a
    subnormal or inf). `alternative`: what the caller's special value means ("None = computed");
    `expected`: the message's words for what is accepted. Returns float(value), unrounded: the
    CPU paths that read it as float64 keep it."""
    try:
        x = float(value)
    except OverflowError:  # an int beyond float64
        x = math.copysign(math.inf, value)
    f = _as_float32(x)
    if lo <= f <= hi:
        return x
    if math.isfinite(x) and x != 0:
        note = (
            " (inf in float32)" if math.isinf(f)
            else " (0 in float32)" if f == 0
            else " (subnormal in float32)" if abs(f) < FLOAT32_TINY
            else ""
        )  # fmt: skip
    else:
        note = ""
    tail = f" ({alternative})" if alternative else ""
    raise ValueError(
        f"{name}: expected {expected}, got {value!r}{note}; as a float32 it must lie in "
        f"[{lo:.3g}, {hi:.3g}]{tail}"
    )


def check_softmax_scale(softmax_scale: object) -> float:
    """None -> 0.0, which the C++ side resolves to 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(
            f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}"
        )
    return check_float32(
        softmax_scale, "softmax_scale", FLOAT32_TINY, SOFTMAX_SCALE_MAX, "None = 1/sqrt(head_dim)"
    )


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
    # The common cases first, without building torch.device objects (each costs about a
    # microsecond, and an eager decode step checks a dozen tensors).
    if t.is_cuda:
        if like.is_cuda and t.get_device() == like.get_device():
            return
    elif t.is_cpu and like.is_cpu:
        return
    device = t.device
    if device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"{name}: device {device} is not supported (cpu or cuda)")
    if device != like.device:
        raise ValueError(f"{name}: on {device}, but {like_name} is on {like.device}")


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
    return check_float32(value, name, *NVFP4_ENCODE_SCALE_RANGE, "None = computed")


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
