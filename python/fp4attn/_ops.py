"""torch.library custom ops over the extension, with fake (meta) kernels for torch.compile and
CUDA graphs. Attention tensors here are BSHD; layouts and argument checks live in api.py (the
paged KV cache's in paged.py).

Each op allocates its outputs with torch and lets the extension fill them: on CPU through the
golden model, on CUDA through the kernels, on the current stream (no synchronization, so the ops
can be captured in a CUDA graph).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._layout import (
    E4M3,
    GPU_BACKWARD_RECIPES,
    SCALE_TILE,
    SMOOTHS_K,
    operand_dtype,
    operand_shapes,
    v_position_of,
)
from ._native import _C, UnsupportedError, as_codes, cuda_stream, require_cuda_build, run_cuda


def _outputs(q_shape, dtype, device):
    b, s_q, h, d = q_shape
    o = torch.empty((b, s_q, h, d), dtype=dtype, device=device)
    lse = torch.empty((b, h, s_q), dtype=torch.float32, device=device)
    return o, lse


# ---- attention on q, k, v ---------------------------------------------------------------------


@torch.library.custom_op("fp4attn::attn_fwd", mutates_args=())
def attn_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    recipe: str,
    softmax_scale: float,
    causal: bool,
    d_source: str = "forward-o",
    smooth_k: bool = False,
) -> tuple[Tensor, Tensor]:
    """Forward attention, BSHD. softmax_scale 0 means 1/sqrt(head_dim). Returns (o, lse).

    d_source is for the backward only (which O enters D = rowsum(dO * O), numerics.md §8); it is
    an argument so that autograd sees it. smooth_k (K smoothing, numerics.md §3) runs here on CPU
    tensors only: on CUDA, api.attn_func builds it from the operand ops (attn_quantized_fwd)."""
    o, lse = _outputs(q.shape, q.dtype, q.device)
    if q.device.type == "cuda":
        if smooth_k:
            raise UnsupportedError(
                "smooth_k: fp4attn::attn_fwd smooths K on CPU tensors only; on CUDA call "
                "fp4attn.attn_func(..., smooth_k=True), which runs it on the kernel operands"
            )
        require_cuda_build("q")
        with torch.cuda.device(q.device):
            run_cuda(
                _C.attention_cuda,
                q,
                k,
                v,
                o,
                lse,
                recipe,
                softmax_scale,
                causal,
                cuda_stream(q.device),
            )
    else:
        _C.golden_forward(q, k, v, o, lse, recipe, softmax_scale, causal, smooth_k)
    return o, lse


@attn_fwd.register_fake
def _(q, k, v, recipe, softmax_scale, causal, d_source="forward-o", smooth_k=False):
    return _outputs(q.shape, q.dtype, q.device)


# ---- kernel operands --------------------------------------------------------------------------


@torch.library.custom_op("fp4attn::quantize_operand", mutates_args=())
def quantize_operand(
    x: Tensor, recipe: str, role: str, tensor_scale: float
) -> tuple[Tensor, Tensor]:
    """The kernel operand (data, scale) of a BSHD input for `role` in ('q', 'k', 'v')."""
    data_shape, scale_shape = operand_shapes(x.shape, role)
    data = torch.empty(data_shape, dtype=operand_dtype(recipe, role), device=x.device)
    scale = torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    if x.device.type == "cuda":
        require_cuda_build(role)
        with torch.cuda.device(x.device):
            run_cuda(
                _C.quantize_operand_cuda,
                x,
                recipe,
                role,
                tensor_scale,
                False,
                as_codes(data),
                scale,
                None,
                cuda_stream(x.device),
            )
    else:
        _C.quantize_operand_host(x, recipe, role, tensor_scale, False, as_codes(data), scale, None)
    return data, scale


@quantize_operand.register_fake
def _(x, recipe, role, tensor_scale):
    data_shape, scale_shape = operand_shapes(x.shape, role)
    return (
        x.new_empty(data_shape, dtype=operand_dtype(recipe, role)),
        x.new_empty(scale_shape, dtype=torch.float32),
    )


@torch.library.custom_op("fp4attn::quantize_k_smoothed", mutates_args=())
def quantize_k_smoothed(
    x: Tensor, recipe: str, tensor_scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The K operand (data, scale) of a BSHD k smoothed first (k - mean over the sequence per
    (batch, kv head, channel), numerics.md §3), and that mean, float32 [b, h_kv, d] (BF16 values:
    the golden model rounds it so)."""
    data_shape, scale_shape = operand_shapes(x.shape, "k")
    data = torch.empty(data_shape, dtype=operand_dtype(recipe, "k"), device=x.device)
    scale = torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    b, _, h, d = x.shape
    mean = torch.empty((b, h, d), dtype=torch.float32, device=x.device)
    if x.device.type == "cuda":
        require_cuda_build("k")
        with torch.cuda.device(x.device):
            run_cuda(
                _C.quantize_operand_cuda,
                x,
                recipe,
                "k",
                tensor_scale,
                True,
                as_codes(data),
                scale,
                mean,
                cuda_stream(x.device),
            )
    else:
        _C.quantize_operand_host(x, recipe, "k", tensor_scale, True, as_codes(data), scale, mean)
    return data, scale, mean


@quantize_k_smoothed.register_fake
def _(x, recipe, tensor_scale):
    data_shape, scale_shape = operand_shapes(x.shape, "k")
    b, _, h, d = x.shape
    return (
        x.new_empty(data_shape, dtype=operand_dtype(recipe, "k")),
        x.new_empty(scale_shape, dtype=torch.float32),
        x.new_empty((b, h, d), dtype=torch.float32),
    )


def smooth_k_lse(lse: Tensor, q: Tensor, mean: Tensor, softmax_scale: float) -> Tensor:
    """The LSE of attention on unsmoothed K from the LSE over smoothed K (softmax ignores the
    per-row constant q . mean, the LSE does not): lse + scale * q . mean per row, in float64 and
    rounded once to float32, as the golden model adds it (q read as the forward reads it: its
    FP32 values). lse [b, h, s_q] float32, q BSHD, mean [b, h_kv, d]. Rows without keys stay
    +inf. Not differentiated through q (the LSE output is not differentiable)."""
    d = q.shape[3]
    scale = softmax_scale if softmax_scale > 0 else 1.0 / math.sqrt(d)
    group = q.shape[2] // mean.shape[1] if mean.shape[1] > 0 else 1
    m = mean.double().repeat_interleave(group, dim=1)  # [b, h, d]
    # A product and a sum, not a GEMM: no cuBLAS, so deterministic mode needs no workspace config.
    qm = (q.detach().float().double() * m[:, None]).sum(-1).transpose(1, 2)  # [b, h, s_q]
    return (lse.double() + scale * qm).float()


def dequantize_operand(data: Tensor, scale: Tensor, role: str, seqlen: int) -> Tensor:
    """BSHD float64 values of an operand: data x its scale (operands.h). Exact: a code of at most
    8 significant bits times an FP32 scale fits in float64's 53."""
    data = data.double()
    if role == "v":  # data [b, h, d, pitch] with keys permuted, scale per channel [b, h, d]
        values = (
            data.index_select(3, v_position_of(seqlen, data.device)) * scale.double()[..., None]
        )
        return values.permute(0, 3, 1, 2)
    # data [b, h, s, d], scale [b, h, tiles] for SCALE_TILE-token tiles
    row_scale = scale.double().repeat_interleave(SCALE_TILE, dim=2)[:, :, :seqlen, None]
    return (data * row_scale).transpose(1, 2)


@torch.library.custom_op("fp4attn::fake_quantize", mutates_args=())
def fake_quantize(
    x: Tensor, recipe: str, role: str, tensor_scale: float, out_dtype: torch.dtype
) -> Tensor:
    """x's operand values for `role` (what the recipe's forward multiplies), BSHD, out_dtype."""
    # The forward reads its inputs as FP32 values (numerics.md §1); so does the quantizer here.
    src = x if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x.float()
    if role == "k" and recipe in SMOOTHS_K:
        # The forward multiplies K minus its mean and adds q . mean back to the LSE: attention on
        # these values (the smoothed operand plus the mean) gives its O and its LSE.
        data, scale, mean = quantize_k_smoothed(src, recipe, tensor_scale)
        values = dequantize_operand(data, scale, role, x.shape[1]) + mean.double()[:, None]
        return values.to(out_dtype).contiguous()
    data, scale = quantize_operand(src, recipe, role, tensor_scale)
    return dequantize_operand(data, scale, role, x.shape[1]).to(out_dtype).contiguous()


@fake_quantize.register_fake
def _(x, recipe, role, tensor_scale, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


def _fake_quantize_setup_context(ctx, inputs, output):
    ctx.x_dtype = inputs[0].dtype


def _fake_quantize_backward(ctx, grad):
    return grad.to(ctx.x_dtype), None, None, None, None  # straight through


fake_quantize.register_autograd(_fake_quantize_backward, setup_context=_fake_quantize_setup_context)


# ---- attention on kernel operands -------------------------------------------------------------


@torch.library.custom_op("fp4attn::attn_operands_fwd", mutates_args=())
def attn_operands_fwd(
    q_data: Tensor,
    q_scale: Tensor,
    k_data: Tensor,
    k_scale: Tensor,
    v_data: Tensor,
    v_scale: Tensor,
    recipe: str,
    softmax_scale: float,
    causal: bool,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Forward attention over kernel operands (operands.h layouts). Returns BSHD (o, lse)."""
    return _operands_forward(
        q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal, out_dtype
    )


def _operands_forward(
    q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal, out_dtype,
    row_max=None,
):  # fmt: skip
    """row_max (CUDA only): also receives each row's integer log2 reference (nvfp4-fast's
    backward rebuilds its P codes from it)."""
    b, h, s_q, d = q_data.shape
    o, lse = _outputs((b, s_q, h, d), out_dtype, q_data.device)
    args = (
        as_codes(q_data),
        q_scale,
        as_codes(k_data),
        k_scale,
        as_codes(v_data),
        v_scale,
        o,
        lse,
        recipe,
        softmax_scale,
        causal,
    )
    if q_data.device.type == "cuda":
        require_cuda_build("q_data")
        with torch.cuda.device(q_data.device):
            run_cuda(_C.attention_operands_cuda, *args, cuda_stream(q_data.device), row_max)
    else:
        _C.attention_operands_host(*args)
    return o, lse


@attn_operands_fwd.register_fake
def _(q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal, out_dtype):
    b, h, s_q, d = q_data.shape
    return _outputs((b, s_q, h, d), out_dtype, q_data.device)


# ---- packed FP4 storage (plain functions: the ring's wire format, fp4attn.distributed) ---------


def quantize_packed_into(x: Tensor, fmt: str, rule: str, packed, scales, s_enc_out) -> None:
    """Packed FP4 of a BSHD tensor into packed U8 [b, s, h, d / 2] and row-major scales U8
    [b, s, h, d / block] (include/fp4attn/quantize_cuda.h). NVFP4: the tensor scale s_enc comes
    from x's amax and is written to s_enc_out (F32 [1]); MXFP4: s_enc_out is None."""
    if x.device.type == "cuda":
        require_cuda_build("x")
        with torch.cuda.device(x.device):
            run_cuda(
                _C.quantize_packed_cuda,
                x,
                fmt,
                rule,
                0.0,
                packed,
                scales,
                s_enc_out,
                cuda_stream(x.device),
            )
    else:
        _C.quantize_packed_host(x, fmt, rule, 0.0, packed, scales, s_enc_out)


def repack_operand(
    packed: Tensor, scales: Tensor, fmt: str, recipe: str, role: str, s_enc: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Q/K kernel operand (data E4M3 [b, h, s, d], scale F32 [b, h, tiles]) of packed FP4 (as
    quantize_packed_into writes it), folded without requantizing: the bytes quantize_operand gives
    for the values the codes came from. The data do not depend on s_enc (NVFP4 scale = 8 /
    s_enc). Combinations that would requantize raise UnsupportedError."""
    b, s, h, half = packed.shape
    data_shape, scale_shape = operand_shapes((b, s, h, 2 * half), "q")  # the Q/K layout
    data = torch.empty(data_shape, dtype=E4M3, device=packed.device)
    scale = torch.empty(scale_shape, dtype=torch.float32, device=packed.device)
    args = (packed, scales, fmt, s_enc, recipe, role, as_codes(data), scale)
    if packed.device.type == "cuda":
        require_cuda_build("packed")
        with torch.cuda.device(packed.device):
            run_cuda(_C.repack_to_operand_cuda, *args, cuda_stream(packed.device))
    else:
        run_cuda(_C.repack_to_operand_host, *args)
    return data, scale


# ---- backward (CPU: the golden model; CUDA: the GPU backward of the exp2 recipes) ---------------

# GPU_BACKWARD_RECIPES (_layout, from _C): the recipes whose backward runs on the GPU
# (docs/kernels/bwd_sm90.md), every engine recipe; nvfp4-fast's and fp4-direct's need the
# forward's row_max (attn_quantized_fwd saves it).


def _require_gpu_backward(recipe: str, what: str) -> None:
    require_cuda_build(what)
    if recipe not in GPU_BACKWARD_RECIPES:
        raise UnsupportedError(
            f"recipe: '{recipe}' has no GPU backward yet (it has: "
            f"{', '.join(GPU_BACKWARD_RECIPES)}); run attn_func on CPU tensors for its gradients"
        )


def _grad_dtype(dtype: torch.dtype) -> torch.dtype:
    # BF16 gradients come straight from the kernel (RNE of its FP32 sums); FP16 ones via FP32.
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def _refuse_lse_gradient(dlse: Tensor | None) -> None:
    if dlse is not None and bool(dlse.ne(0).any()):
        raise UnsupportedError(
            "lse: fp4attn's backward differentiates o only; a loss that depends on the returned "
            "lse (nonzero gradient reaching it) is not supported"
        )


def _attn_bwd_cuda(dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source):
    _require_gpu_backward(recipe, "q")
    gdt = _grad_dtype(q.dtype)
    dq = torch.empty(q.shape, dtype=gdt, device=q.device)
    dk = torch.empty(k.shape, dtype=gdt, device=k.device)
    dv = torch.empty(v.shape, dtype=gdt, device=v.device)
    with torch.cuda.device(q.device):
        run_cuda(
            _C.attention_backward_cuda,
            q,
            k,
            v,
            o,
            lse,
            dout,
            dq,
            dk,
            dv,
            recipe,
            softmax_scale,
            causal,
            torch.are_deterministic_algorithms_enabled(),
            d_source,
            cuda_stream(q.device),
        )
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _golden_bwd(dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source, scales, smooth_k):
    """The golden model's backward on CPU q, k, v: float32 gradients (float64 for float64 inputs),
    returned in q's dtype."""
    if q.device.type != "cpu":
        raise UnsupportedError(f"q: on {q.device}: fp4attn's backward runs on CUDA or CPU tensors")
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.empty(q.shape, dtype=acc)
    dk = torch.empty(k.shape, dtype=acc)
    dv = torch.empty(v.shape, dtype=acc)
    _C.golden_backward(
        q,
        k,
        v,
        o,
        dout,
        lse,
        dq,
        dk,
        dv,
        recipe,
        softmax_scale,
        causal,
        d_source,
        *scales,
        smooth_k,
    )
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@torch.library.custom_op("fp4attn::attn_bwd", mutates_args=())
def attn_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    recipe: str,
    softmax_scale: float,
    causal: bool,
    d_source: str,
    smooth_k: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of attn_fwd, in q's dtype, from what the forward saved (o, lse).

    dlse, the gradient reaching the LSE output, must be None or all zero: the LSE is not
    differentiated (a nonzero one raises UnsupportedError rather than being dropped). CUDA
    tensors: the GPU backward (exp2 recipes; 'high-precision-o' needs its v2 kernel, the default;
    deterministic when torch.use_deterministic_algorithms is on); CPU tensors: the golden model
    (smooth_k as the forward had it)."""
    _refuse_lse_gradient(dlse)
    if q.device.type == "cuda":
        if smooth_k:
            raise UnsupportedError("smooth_k: fp4attn::attn_bwd smooths K on CPU tensors only")
        return _attn_bwd_cuda(dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source)
    return _golden_bwd(
        dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source, (0.0, 0.0, 0.0), smooth_k
    )


@attn_bwd.register_fake
def _(dout, q, k, v, o, lse, dlse, recipe, softmax_scale, causal, d_source, smooth_k=False):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _attn_setup_context(ctx, inputs, output):
    q, k, v, recipe, softmax_scale, causal, d_source, smooth_k = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = (recipe, softmax_scale, causal, d_source, smooth_k)
    # An unused LSE output then reaches the backward as None, not as a zero tensor whose check
    # (attn_bwd: any nonzero?) would cost a fill, a reduction and a device sync every call.
    ctx.set_materialize_grads(False)


def _attn_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    recipe, softmax_scale, causal, d_source, smooth_k = ctx.options
    if grad_o is None:  # only the LSE was used: its gradient is refused below, or zero
        grad_o = torch.zeros_like(o)
    dq, dk, dv = attn_bwd(
        grad_o.contiguous(),
        q,
        k,
        v,
        o,
        lse,
        grad_lse,
        recipe,
        softmax_scale,
        causal,
        d_source,
        smooth_k,
    )
    return dq, dk, dv, None, None, None, None, None


attn_fwd.register_autograd(_attn_backward, setup_context=_attn_setup_context)


# ---- attention over kernel operands, differentiable in their q, k, v sources --------------------


@torch.library.custom_op("fp4attn::attn_quantized_fwd", mutates_args=())
def attn_quantized_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_data: Tensor,
    q_scale: Tensor,
    k_data: Tensor,
    k_scale: Tensor,
    v_data: Tensor,
    v_scale: Tensor,
    recipe: str,
    softmax_scale: float,
    causal: bool,
    out_dtype: torch.dtype,
    d_source: str,
    q_tensor_scale: float,
    k_tensor_scale: float,
    v_tensor_scale: float,
    smooth_k: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """attn_operands_fwd on operands quantized from the BSHD q, k, v (with the static tensor
    scales given, 0 = computed; smooth_k: K smoothed, CUDA only, the LSE then without the
    scale * q . mean term, which api adds), differentiable in q, k, v: straight through the
    quantizers. The forward reads only the operands; the backward (attn_quantized_bwd) runs on
    the saved operands on CUDA and on the sources (the golden model re-derives the same operands)
    on CPU. Returns BSHD (o, lse, row_max): row_max [b, h, s_q] is each row's integer log2
    reference on CUDA (saved for nvfp4-fast's backward), empty on CPU (the golden model's
    backward derives it)."""
    if smooth_k and q_data.device.type != "cuda":
        raise UnsupportedError(
            "smooth_k: the operand path smooths K on CUDA only (CPU: attn_fwd's golden model)"
        )
    row_max = _row_max_output(q_data)
    o, lse = _operands_forward(
        q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal, out_dtype,
        row_max if row_max.numel() > 0 else None,
    )  # fmt: skip
    return o, lse, row_max


def _row_max_output(q_data: Tensor) -> Tensor:
    b, h, s_q, _ = q_data.shape
    shape = (b, h, s_q) if q_data.device.type == "cuda" else (0,)
    return torch.empty(shape, dtype=torch.float32, device=q_data.device)


@attn_quantized_fwd.register_fake
def _(q, k, v, q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal,
      out_dtype, d_source, q_tensor_scale, k_tensor_scale, v_tensor_scale, smooth_k):  # fmt: skip
    b, h, s_q, d = q_data.shape
    return (*_outputs((b, s_q, h, d), out_dtype, q_data.device), _row_max_output(q_data))


def _quantized_bwd_cuda(
    dout, o, lse, row_max, operands, recipe, softmax_scale, causal, d_source, smooth_k
):
    q_data, q_scale, k_data, k_scale, v_data, v_scale = operands
    _require_gpu_backward(recipe, "q_data")
    b, h, s_q, d = q_data.shape
    h_kv, s_k = k_data.shape[1], k_data.shape[2]
    gdt = _grad_dtype(o.dtype)
    dq = torch.empty((b, s_q, h, d), dtype=gdt, device=o.device)
    # smooth_k: dK in FP32, so that its mean is subtracted before the one rounding.
    dk = torch.empty((b, s_k, h_kv, d), dtype=torch.float32 if smooth_k else gdt, device=o.device)
    dv = torch.empty((b, s_k, h_kv, d), dtype=gdt, device=o.device)
    with torch.cuda.device(o.device):
        run_cuda(
            _C.attention_backward_operands_cuda,
            as_codes(q_data),
            q_scale,
            as_codes(k_data),
            k_scale,
            as_codes(v_data),
            v_scale,
            o,
            lse,
            dout,
            dq,
            dk,
            dv,
            recipe,
            softmax_scale,
            causal,
            torch.are_deterministic_algorithms_enabled(),
            d_source,
            cuda_stream(o.device),
            row_max,
        )
    if smooth_k and s_k > 0:
        # K entered as k_j - mean_l(k_l) (the mean's BF16 rounding straight through): the chain
        # rule subtracts the mean over the keys of dK, per (batch, kv head, channel), as
        # golden_attention_backward does.
        dk = dk - dk.mean(dim=1, keepdim=True)
    return dq.to(o.dtype), dk.to(o.dtype), dv.to(o.dtype)


@torch.library.custom_op("fp4attn::attn_quantized_bwd", mutates_args=())
def attn_quantized_bwd(
    dout: Tensor,
    o: Tensor,
    lse: Tensor,
    row_max: Tensor | None,
    dlse: Tensor | None,
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor | None,
    q_data: Tensor | None,
    q_scale: Tensor | None,
    k_data: Tensor | None,
    k_scale: Tensor | None,
    v_data: Tensor | None,
    v_scale: Tensor | None,
    recipe: str,
    softmax_scale: float,
    causal: bool,
    d_source: str,
    q_tensor_scale: float,
    k_tensor_scale: float,
    v_tensor_scale: float,
    smooth_k: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of attn_quantized_fwd, BSHD, in o's dtype. CUDA: the GPU backward
    on the kernel operands (q/k/v may be None); CPU: the golden model's backward on the sources
    q, k, v with the same recipe and static tensor scales (the operands may be None). dlse: as
    attn_bwd's (None or zero). row_max: the forward's (CUDA; nvfp4-fast reads it)."""
    _refuse_lse_gradient(dlse)
    if o.device.type == "cuda":
        operands = (q_data, q_scale, k_data, k_scale, v_data, v_scale)
        if any(t is None for t in operands):
            raise ValueError("q_data: the CUDA backward needs the six kernel operands")
        return _quantized_bwd_cuda(
            dout, o, lse, row_max, operands, recipe, softmax_scale, causal, d_source, smooth_k
        )
    if q is None or k is None or v is None:
        raise ValueError("q: the CPU backward needs the q, k, v the operands were made from")
    if smooth_k:
        raise UnsupportedError("smooth_k: the operand path smooths K on CUDA only")
    scales = (q_tensor_scale, k_tensor_scale, v_tensor_scale)
    dq, dk, dv = _golden_bwd(
        dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source, scales, False
    )
    return dq.to(o.dtype), dk.to(o.dtype), dv.to(o.dtype)


@attn_quantized_bwd.register_fake
def _(dout, o, lse, row_max, dlse, q, k, v, q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe,
      softmax_scale, causal, d_source, q_tensor_scale, k_tensor_scale, v_tensor_scale,
      smooth_k):  # fmt: skip
    if q is not None:
        shapes = (q.shape, k.shape, v.shape)
    else:
        b, h, s_q, d = q_data.shape
        h_kv, s_k = k_data.shape[1], k_data.shape[2]
        shapes = ((b, s_q, h, d), (b, s_k, h_kv, d), (b, s_k, h_kv, d))
    return tuple(o.new_empty(sh) for sh in shapes)


def _quantized_setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    operands = inputs[3:9]
    o, lse, row_max = output
    # What each backward reads, and nothing else: CUDA the operands (E4M3: half of BF16 q/k/v,
    # and no requantization) and row_max, CPU the sources (the golden model quantizes them again,
    # bit for bit). With o and the forward's LSE (without smooth_k's q . mean term) in both.
    ctx.on_cuda = o.device.type == "cuda"
    if ctx.on_cuda:
        ctx.save_for_backward(*operands, o, lse, row_max)
    else:
        ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = inputs[9:12] + inputs[13:]  # recipe .. causal, d_source .. smooth_k
    ctx.set_materialize_grads(False)


def _quantized_backward(ctx, grad_o, grad_lse, grad_row_max):
    saved = ctx.saved_tensors
    if ctx.on_cuda:
        sources, operands, (o, lse, row_max) = (None, None, None), saved[:6], saved[6:]
    else:
        sources, operands, (o, lse), row_max = saved[:3], (None,) * 6, saved[3:], None
    recipe, softmax_scale, causal, d_source, tq, tk, tv, smooth_k = ctx.options
    if grad_o is None:  # only the LSE was used: its gradient is refused below, or zero
        grad_o = torch.zeros_like(o)
    dq, dk, dv = attn_quantized_bwd(
        grad_o.contiguous(),
        o,
        lse,
        row_max,
        grad_lse,
        *sources,
        *operands,
        recipe,
        softmax_scale,
        causal,
        d_source,
        tq,
        tk,
        tv,
        smooth_k,
    )
    return (dq, dk, dv) + (None,) * 15


attn_quantized_fwd.register_autograd(_quantized_backward, setup_context=_quantized_setup_context)


# ---- attention over kernel operands without their sources: no gradient -----------------------


def _no_backward(ctx, *grads):
    raise NotImplementedError(
        "fp4attn: attn_quantized has no gradient for operands without their sources (quantized "
        "codes are not differentiable). To get gradients, build the operands with "
        "fp4attn.quantize_qkv(q, k, v, ...) on q, k, v that require grad, with grad mode on: "
        "attn_quantized then differentiates with respect to those q, k, v (straight through the "
        "quantizers); or use attn_func; or run under torch.no_grad()/torch.inference_mode()"
    )


def _no_context(ctx, inputs, output):
    pass


attn_operands_fwd.register_autograd(_no_backward, setup_context=_no_context)

# ---- the paged KV cache (fp4attn.paged checks the arguments first) ----------------------------


def _cache_codes(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt):
    """The cache's tensors as the extension takes them (FP8 codes as uint8), and its format."""

    def codes(t):
        return None if t is None else as_codes(t)

    return (
        codes(k_data),
        codes(v_data),
        codes(k_scales),
        codes(v_scales),
        k_global,
        v_global,
        fmt,
    )


@torch.library.custom_op(
    "fp4attn::paged_kv_append",
    mutates_args=("k_data", "v_data", "k_scales", "v_scales", "k_global", "v_global", "errors"),
)
def paged_kv_append(
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    k_data: Tensor,
    v_data: Tensor,
    k_scales: Tensor | None,
    v_scales: Tensor | None,
    k_global: Tensor,
    v_global: Tensor,
    fmt: str,
    rule: str,
    errors: Tensor | None,
) -> None:
    """Writes k, v [num_tokens, kv_heads, head_dim] into the cache's tensors at slot_mapping
    (int32 or int64, read as is), in place; an uncalibrated global (0) is set first from
    nonzero finite data (include/fp4attn/paged_kv.h). CUDA: a slot past the cache sets a bit of errors (int32 [1])."""
    cache = _cache_codes(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt)
    if k.device.type == "cuda":
        require_cuda_build("append_kv")
        # The calibration's scratch from torch's allocator (graph-capturable, no cudaMallocAsync).
        scratch = torch.empty(4, dtype=torch.int32, device=k.device)
        run_cuda(
            _C.paged_kv_append_cuda,
            k,
            v,
            slot_mapping,
            *cache,
            rule,
            errors,
            scratch,
            True,
            cuda_stream(k.device),
        )
    else:
        _C.paged_kv_append_host(k, v, slot_mapping, *cache, rule)


@paged_kv_append.register_fake
def _(k, v, slot_mapping, k_data, v_data, k_scales, v_scales, k_global, v_global, fmt, rule,
      errors):  # fmt: skip
    return None


def _paged_outputs(q, batch: int, cu_seqlens_q, return_lse: bool):
    """o like q, and lse float32 [heads, total_q] (varlen) or [batch, heads, s_q]; an empty lse
    when it is not asked for (the extension then skips it)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    heads = q.shape[-2]
    if not return_lse:
        shape = (0,)
    elif cu_seqlens_q is not None:
        shape = (heads, q.shape[0])
    else:
        shape = (batch, heads, q.shape[1])
    return o, torch.empty(shape, dtype=torch.float32, device=q.device)


def _paged_decode(q, cu_seqlens_q, cache, block_tables, seq_lens, softmax_scale, causal, o, lse,
                  workspace, num_splits, errors):  # fmt: skip
    """Runs the decode into o (and lse, when not None). CPU: the golden paged attention, which
    checks the indices on the host; CUDA: the decode kernel, indices read on the device only."""
    if q.device.type == "cuda":
        require_cuda_build("decode")
        with torch.cuda.device(q.device):
            run_cuda(
                _C.paged_attention_cuda,
                q,
                cu_seqlens_q,
                *cache,
                block_tables,
                seq_lens,
                softmax_scale,
                causal,
                o,
                lse,
                workspace,
                num_splits,
                errors,
                cuda_stream(q.device),
            )
    else:
        _C.golden_paged_attention_host(
            q, cu_seqlens_q, *cache, block_tables, seq_lens, softmax_scale, causal, o, lse
        )


@torch.library.custom_op("fp4attn::paged_decode", mutates_args=("workspace", "errors"))
def paged_decode(
    q: Tensor,
    cu_seqlens_q: Tensor | None,
    k_data: Tensor,
    v_data: Tensor,
    k_scales: Tensor | None,
    v_scales: Tensor | None,
    k_global: Tensor,
    v_global: Tensor,
    fmt: str,
    block_tables: Tensor,
    seq_lens: Tensor,
    softmax_scale: float,
    causal: bool,
    return_lse: bool,
    workspace: Tensor | None,
    num_splits: int,
    errors: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Attention of q over the paged cache: (o, lse), lse empty unless return_lse. workspace,
    num_splits: a DecodePlan's (None, 0: the call picks and allocates); errors: the cache's device
    error flag (CUDA)."""
    o, lse = _paged_outputs(q, block_tables.shape[0], cu_seqlens_q, return_lse)
    cache = _cache_codes(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt)
    _paged_decode(q, cu_seqlens_q, cache, block_tables, seq_lens, softmax_scale, causal, o,
                  lse if return_lse else None, workspace, num_splits, errors)  # fmt: skip
    return o, lse


@paged_decode.register_fake
def _(q, cu_seqlens_q, k_data, v_data, k_scales, v_scales, k_global, v_global, fmt, block_tables,
      seq_lens, softmax_scale, causal, return_lse, workspace, num_splits, errors):  # fmt: skip
    return _paged_outputs(q, block_tables.shape[0], cu_seqlens_q, return_lse)


@torch.library.custom_op(
    "fp4attn::paged_decode_into", mutates_args=("o", "lse", "workspace", "errors")
)
def paged_decode_into(
    q: Tensor,
    cu_seqlens_q: Tensor | None,
    k_data: Tensor,
    v_data: Tensor,
    k_scales: Tensor | None,
    v_scales: Tensor | None,
    k_global: Tensor,
    v_global: Tensor,
    fmt: str,
    block_tables: Tensor,
    seq_lens: Tensor,
    softmax_scale: float,
    causal: bool,
    o: Tensor,
    lse: Tensor | None,
    workspace: Tensor | None,
    num_splits: int,
    errors: Tensor | None,
) -> None:
    """paged_decode into the caller's o (and lse): no allocation."""
    cache = _cache_codes(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt)
    _paged_decode(q, cu_seqlens_q, cache, block_tables, seq_lens, softmax_scale, causal, o, lse,
                  workspace, num_splits, errors)  # fmt: skip


@paged_decode_into.register_fake
def _(q, cu_seqlens_q, k_data, v_data, k_scales, v_scales, k_global, v_global, fmt, block_tables,
      seq_lens, softmax_scale, causal, o, lse, workspace, num_splits, errors):  # fmt: skip
    return None


def paged_check_indices(q, cu_seqlens_q, cache, block_tables, seq_lens) -> None:
    """The host value checks of the indices (copies them to the host: a sync)."""
    cu = None if cu_seqlens_q is None else cu_seqlens_q.cpu()
    codes = _cache_codes(*cache)
    _C.paged_check_indices_host(q, cu, *codes, block_tables.cpu(), seq_lens.cpu())


def paged_decode_schedule(*args) -> tuple[int, int, int]:
    """(num_splits, split_size, workspace_bytes) of paged_attention_cuda (paged_attention_cuda.h)."""
    require_cuda_build("decode")
    return _C.paged_decode_schedule(*args)


@torch.library.custom_op("fp4attn::paged_kv_dequantize", mutates_args=())
def paged_kv_dequantize(
    k_data: Tensor,
    v_data: Tensor,
    k_scales: Tensor | None,
    v_scales: Tensor | None,
    k_global: Tensor,
    v_global: Tensor,
    fmt: str,
    block_tables: Tensor,
    seq_lens: Tensor,
    max_len: int,
    head_dim: int,
) -> tuple[Tensor, Tensor]:
    """The cached K and V of every sequence, float32 [batch, max(max_len, 1), kv_heads,
    head_dim] (0 past each sequence's length; max_len: the longest seq_lens entry). CPU only."""
    shape = (block_tables.shape[0], max(max_len, 1), k_data.shape[2], head_dim)
    k = torch.empty(shape, dtype=torch.float32)
    v = torch.empty(shape, dtype=torch.float32)
    cache = _cache_codes(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt)
    _C.paged_kv_dequantize_host(*cache, block_tables, seq_lens, k, v)
    return k, v


@paged_kv_dequantize.register_fake
def _(k_data, v_data, k_scales, v_scales, k_global, v_global, fmt, block_tables, seq_lens,
      max_len, head_dim):  # fmt: skip
    shape = (block_tables.shape[0], max(max_len, 1), k_data.shape[2], head_dim)
    return tuple(k_data.new_empty(shape, dtype=torch.float32) for _ in range(2))


__all__ = [
    "attn_bwd",
    "attn_fwd",
    "attn_operands_fwd",
    "attn_quantized_bwd",
    "attn_quantized_fwd",
    "fake_quantize",
    "paged_check_indices",
    "paged_decode",
    "paged_decode_into",
    "paged_decode_schedule",
    "paged_kv_append",
    "paged_kv_dequantize",
    "quantize_k_smoothed",
    "quantize_operand",
]
