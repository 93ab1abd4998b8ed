"""The public functions: attention on q/k/v (flash_attn_func's signature), and the quantize-once
pair quantize_qkv / attn_quantized."""

from __future__ import annotations

import torch

from . import _checks, _defaults, _layout, _ops
from ._native import UnsupportedError
from .quantized import QuantizedQKV


def attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    recipe: str | None = None,
    return_lse: bool = False,
    layout: str = "bshd",
    d_source: str = "forward-o",
    smooth_k: bool = False,
):
    """Attention with the operands quantized by `recipe` (docs/numerics.md).

    q [b, s_q, h, d], k and v [b, s_k, h_kv, d] for layout "bshd" (flash_attn_func's), or
    [b, h, s, d] for "bhsd" (torch SDPA's); h % h_kv == 0 (GQA/MQA), d 64 or 128, head_dim
    contiguous. CUDA: float16/bfloat16; CPU (the golden model): also float32/float64.
    softmax_scale defaults to 1/sqrt(d); causal is bottom-right aligned (FlashAttention's
    convention). Returns o in q's layout and dtype, and with return_lse also lse float32
    [b, h, s_q] (natural log).

    Autograd: gradients flow through o, computed by the golden model's backward on CPU tensors
    and by the GPU backward on CUDA ones (every engine recipe; docs/python.md "Autograd"); d_source picks the O of D = rowsum(dO * O): "forward-o" (the
    quantized forward's) or "high-precision-o" (docs/numerics.md §8). lse is not differentiated.

    smooth_k: SageAttention's K smoothing (numerics.md §3): K minus its mean over the sequence
    (per batch, kv head and channel; the mean rounded to BF16) is quantized instead of K. Softmax
    ignores the per-row constant q . mean, so o is attention on K up to quantization (smaller
    quantization error when K has a large channel mean); lse gets scale * q . mean added back.
    CPU: every recipe, forward and backward (the golden model). CUDA: the forward for every
    recipe the engine runs (K smoothed by the GPU quantizer, attention on the operands, the LSE
    term added in float64); gradients for the GPU backward's recipes (fp8, nvfp4, nvfp4-hx,
    mxfp4, nvfp4-all, nvfp4-fast, fp4-direct), computed on the forward's operands with dK minus its mean over the keys (the chain
    rule through the mean, as the golden model's); other recipes raise UnsupportedError in
    backward().
    """
    _checks.check_layout(layout)
    _checks.check_qkv(q, k, v, layout)
    scale = _checks.check_softmax_scale(softmax_scale)
    _checks.check_bool(causal, "causal")
    _checks.check_bool(return_lse, "return_lse")
    recipe = _defaults.resolve(recipe)
    _checks.check_choice(d_source, "d_source", _checks.D_SOURCES)
    _checks.check_bool(smooth_k, "smooth_k")
    smooth_k = smooth_k or recipe in _layout.SMOOTHS_K  # the int8 recipes always smooth K
    qb, kb, vb = _layout.to_bshd(q, layout), _layout.to_bshd(k, layout), _layout.to_bshd(v, layout)
    if q.device.type == "cuda" and (smooth_k or _trains_on_gpu(q, k, v, recipe)):
        o, lse = _operands_cuda(qb, kb, vb, recipe, scale, causal, d_source, smooth_k)
    else:
        o, lse = _ops.attn_fwd(qb, kb, vb, recipe, scale, causal, d_source, smooth_k)
    return _layout.result(o, lse, layout, return_lse)


def _trains_on_gpu(q, k, v, recipe) -> bool:
    """Autograd will call the GPU backward: then the forward keeps its operands for it."""
    return (
        torch.is_grad_enabled()
        and recipe in _layout.GPU_BACKWARD_RECIPES
        and any(t.requires_grad for t in (q, k, v))
    )


def _operands_cuda(q, k, v, recipe, scale, causal, d_source, smooth_k):
    """attn_func on CUDA BSHD tensors through the operands: the GPU quantizers, the engine on the
    operands, and a backward on the same saved operands (attn_quantized_fwd's autograd), so that
    Q/K/V are quantized once per training step (the fused attn_fwd path quantizes into scratch
    and its backward quantizes them again) and the backward keeps 1-byte operands instead of
    q, k, v. smooth_k: K smoothed by the quantizer (its mean returned), the golden model's LSE
    term added, dK minus its mean over the keys in the backward."""
    with torch.no_grad():  # constants of attn_quantized_fwd, whose gradient goes to q, k, v
        q_data, q_scale = _ops.quantize_operand(q, recipe, "q", 0.0)
        if smooth_k:
            k_data, k_scale, mean = _ops.quantize_k_smoothed(k, recipe, 0.0)
        else:
            k_data, k_scale = _ops.quantize_operand(k, recipe, "k", 0.0)
        v_data, v_scale = _ops.quantize_operand(v, recipe, "v", 0.0)
    o, lse, _ = _ops.attn_quantized_fwd(
        q, k, v, q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, scale, causal,
        q.dtype, d_source, 0.0, 0.0, 0.0, smooth_k,
    )  # fmt: skip
    return o, (_ops.smooth_k_lse(lse, q, mean, scale) if smooth_k else lse)


def fake_quantize(
    x: torch.Tensor,
    recipe: str | None = None,
    role: str = "q",
    layout: str = "bshd",
    tensor_scale: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Straight-through fake quantization for QAT: the values `recipe`'s forward multiplies for
    operand `role` ("q", "k" or "v") of x, with an identity gradient.

    x as q (role "q") or k/v of attn_func, in `layout`; tensor_scale as in quantize_qkv. Returns
    x's shape and layout in out_dtype (default x's dtype). The values are data code x block
    scale of the kernel operand, exact in float64; another out_dtype rounds them once (RNE).
    """
    _checks.check_layout(layout)
    recipe = _defaults.resolve(recipe)
    _checks.check_choice(role, "role", _checks.ROLES)
    seq = "seqlen_q" if role == "q" else "seqlen_k"
    dims = (
        f"(batch, {seq}, heads, head_dim)"
        if layout == "bshd"
        else f"(batch, heads, {seq}, head_dim)"
    )
    _checks.check_tensor(x, "x", 4, dims)
    _checks.check_device(x, "x", x, "x")
    _checks.check_input_dtype(x, "x")
    _checks.check_last_dim_contiguous(x, "x")
    _checks.check_head_dim(x.shape[3], "x")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"out_dtype: expected a floating-point torch.dtype, got {out_dtype!r}")
    scale = _checks.check_tensor_scale(tensor_scale, "tensor_scale")
    values = _ops.fake_quantize(_layout.to_bshd(x, layout), recipe, role, scale, out_dtype)
    return _layout.to_bshd(values, layout)


def quantize_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: str | None = None,
    layout: str = "bshd",
    q_tensor_scale: float | None = None,
    k_tensor_scale: float | None = None,
    v_tensor_scale: float | None = None,
) -> QuantizedQKV:
    """Quantizes q, k, v into the kernel operands of `recipe` (see QuantizedQKV).

    Same inputs as attn_func (float64 excepted). *_tensor_scale: a static NVFP4 encode scale
    s_enc (e.g. from a checkpoint) for the nvfp4 recipes; None computes it per (batch, head).

    With grad mode on and any of q, k, v requiring grad, the result keeps them (its `sources`),
    and attn_quantized on it is differentiable with respect to them.
    """
    _checks.check_layout(layout)
    _checks.check_qkv(q, k, v, layout)
    recipe = _defaults.resolve(recipe)
    if recipe in _layout.SMOOTHS_K:
        raise UnsupportedError(
            f"recipe: {recipe!r} smooths K, and QuantizedQKV does not carry K's mean (the LSE "
            "correction) yet; use attn_func"
        )
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _checks.check_quantize_dtype(t, name)
    scales = [
        _checks.check_tensor_scale(s, n)
        for s, n in (
            (q_tensor_scale, "q_tensor_scale"),
            (k_tensor_scale, "k_tensor_scale"),
            (v_tensor_scale, "v_tensor_scale"),
        )
    ]
    ops = [
        _ops.quantize_operand(_layout.to_bshd(t, layout), recipe, role, s)
        for t, role, s in ((q, "q", scales[0]), (k, "k", scales[1]), (v, "v", scales[2]))
    ]
    (q_data, q_scale), (k_data, k_scale), (v_data, v_scale) = ops
    # The sources make attn_quantized differentiable (straight through the quantizers); kept
    # only when a gradient can be asked for, so inference holds no extra references.
    track = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return QuantizedQKV(
        q_data,
        q_scale,
        k_data,
        k_scale,
        v_data,
        v_scale,
        recipe,
        q.dtype,
        layout,
        sources=(q, k, v) if track else None,
        tensor_scales=tuple(scales),
    )


def _check_operands(qkv: QuantizedQKV) -> None:
    if not isinstance(qkv, QuantizedQKV):
        raise TypeError(
            f"qkv: expected a QuantizedQKV (from quantize_qkv), got {type(qkv).__name__}"
        )
    _checks.check_recipe(qkv.recipe)
    _checks.check_layout(qkv.layout)
    for name, rank in zip(QuantizedQKV.TENSORS, (4, 3, 4, 3, 4, 3)):
        t = _checks.check_tensor(getattr(qkv, name), name, rank, "(see QuantizedQKV)")
        _checks.check_device(t, name, qkv.q_data, "q_data")
    for name in ("q_data", "k_data", "v_data"):
        code = _layout.operand_dtype(qkv.recipe, name[0])
        if getattr(qkv, name).dtype != code:
            raise TypeError(
                f"{name}: expected dtype {code} for recipe {qkv.recipe!r}, got "
                f"{getattr(qkv, name).dtype}"
            )
    allowed = _checks.CUDA_DTYPES if qkv.device.type == "cuda" else _checks.CPU_DTYPES
    if qkv.out_dtype not in allowed:
        raise TypeError(f"out_dtype: {qkv.out_dtype} is not supported on {qkv.device.type}")
    _checks.check_head_dim(qkv.q_data.shape[3], "q_data")
    ts = qkv.tensor_scales
    if not isinstance(ts, tuple) or len(ts) != 3:
        raise TypeError(f"tensor_scales: expected a tuple of 3 floats (q, k, v), got {ts!r}")
    for i, s in enumerate(ts):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise TypeError(f"tensor_scales[{i}]: expected a float, got {type(s).__name__}")
        if s != 0:
            _checks.check_float32(
                s, f"tensor_scales[{i}]", *_checks.NVFP4_ENCODE_SCALE_RANGE,
                expected="0 (computed) or a finite value > 0",
            )  # fmt: skip
    _check_scale_values(qkv)


def _check_scale_values(qkv: QuantizedQKV) -> None:
    """The scale tensors of a hand-built QuantizedQKV: >= 0 or NaN (the quantizers write NaN for a
    block with a NaN or Inf, which numerics.md's NaN rule carries to O; never a negative or an
    infinite scale). Read on the host, so checked on plain CPU tensors only (not fake ones, under
    torch.compile); on CUDA a check would need a device-to-host copy (a sync), and is not made."""
    if qkv.device.type != "cpu" or torch.compiler.is_compiling():
        return
    for name in ("q_scale", "k_scale", "v_scale"):
        t = getattr(qkv, name)
        if type(t) is not torch.Tensor or t.dtype != torch.float32:
            continue  # a subclass (FakeTensor) has no values; a wrong dtype is the C++ check's
        bad = (t < 0) | torch.isinf(t)
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name}: expected values >= 0 (or NaN, the quantizers' mark of a non-finite "
                f"block), got {float(t[index])} at {index}"
            )


def _check_sources(qkv: QuantizedQKV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The BSHD sources of qkv, checked against its operands (a QuantizedQKV edited by hand)."""
    if not isinstance(qkv.sources, tuple) or len(qkv.sources) != 3:
        raise TypeError("sources: expected a tuple (q, k, v) of tensors or None")
    q, k, v = qkv.sources
    _checks.check_qkv(q, k, v, qkv.layout)
    if q.device != qkv.device:
        raise ValueError(f"sources: on {q.device}, but the operands are on {qkv.device}")
    if q.dtype != qkv.out_dtype:
        raise TypeError(f"sources: dtype {q.dtype} differs from out_dtype {qkv.out_dtype}")
    q, k, v = (_layout.to_bshd(t, qkv.layout) for t in (q, k, v))
    b, h, s_q, d = qkv.q_data.shape
    _, h_kv, s_k, _ = qkv.k_data.shape
    if tuple(q.shape) != (b, s_q, h, d) or tuple(k.shape) != (b, s_k, h_kv, d):
        raise ValueError(
            f"sources: q/k shapes {tuple(q.shape)} / {tuple(k.shape)} (BSHD) do not match the "
            f"operands q_data {tuple(qkv.q_data.shape)} / k_data {tuple(qkv.k_data.shape)} "
            "(BHSD)"
        )
    return q, k, v


def attn_quantized(
    qkv: QuantizedQKV,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    d_source: str = "forward-o",
):
    """Attention over operands from quantize_qkv: the result of attn_func on the same inputs.

    On CPU this runs the golden model's arithmetic on the operands (bit-identical to attn_func
    on CPU); on CUDA the engine reads the operands directly. The output has qkv.out_dtype and
    qkv.layout.

    Autograd: when qkv has sources (quantize_qkv on q, k, v that require grad) and grad mode is
    on, o is differentiable with respect to them, straight through the quantizers: the gradients
    of attn_func on the same inputs (d_source as there). CUDA: the GPU backward on the operands
    themselves (no requantization; exp2 recipes); CPU: the golden model's backward, with the
    static tensor scales. lse is not differentiated. Operands without sources have no gradient.
    """
    _check_operands(qkv)
    scale = _checks.check_softmax_scale(softmax_scale)
    _checks.check_bool(causal, "causal")
    _checks.check_bool(return_lse, "return_lse")
    _checks.check_choice(d_source, "d_source", _checks.D_SOURCES)
    operands = [getattr(qkv, name) for name in QuantizedQKV.TENSORS]
    sources = _check_sources(qkv) if qkv.sources is not None and torch.is_grad_enabled() else None
    if sources is not None and any(t.requires_grad for t in sources):
        q, k, v = sources
        # The gradient goes to the sources; the codes (whose quantize_operand node has no
        # backward) are constants of the op.
        codes = [t.detach() for t in operands]
        o, lse, _ = _ops.attn_quantized_fwd(
            q, k, v, *codes, qkv.recipe, scale, causal, qkv.out_dtype, d_source,
            *(float(s) for s in qkv.tensor_scales), False,
        )  # fmt: skip
    else:
        o, lse = _ops.attn_operands_fwd(*operands, qkv.recipe, scale, causal, qkv.out_dtype)
    return _layout.result(o, lse, qkv.layout, return_lse)
