"""torch.library custom ops over the extension, with fake (meta) kernels for torch.compile and
CUDA graphs. Tensors here are BSHD; layouts and argument checks live in api.py.

Each op allocates its outputs with torch and lets the extension fill them: on CPU through the
golden model, on CUDA through the kernels, on the current stream (no synchronization, so the ops
can be captured in a CUDA graph).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._native import _C, UnsupportedError, as_codes, cuda_stream, require_cuda_build, run_cuda

E4M3 = torch.float8_e4m3fn
V_TOKEN_PAD = 16  # operands.h: V^T rows are padded to a multiple of 16 tokens
SCALE_TILE = 128  # operands.h: one Q/K scale per 128 tokens


def operand_shapes(x_shape, role: str):
    """(data shape, scale shape) of the operand of a BSHD input (include/fp4attn/operands.h)."""
    b, s, h, d = x_shape
    if role == "v":
        pitch = (s + V_TOKEN_PAD - 1) // V_TOKEN_PAD * V_TOKEN_PAD
        return (b, h, d, pitch), (b, h, d)
    return (b, h, s, d), (b, h, (s + SCALE_TILE - 1) // SCALE_TILE)


def operand_dtype(recipe: str) -> torch.dtype:
    return torch.bfloat16 if recipe == "bf16" else E4M3


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
) -> tuple[Tensor, Tensor]:
    """Forward attention, BSHD. softmax_scale 0 means 1/sqrt(head_dim). Returns (o, lse).

    d_source is for the backward only (which O enters D = rowsum(dO * O), numerics.md §8); it is
    an argument so that autograd sees it."""
    o, lse = _outputs(q.shape, q.dtype, q.device)
    if q.device.type == "cuda":
        require_cuda_build("q", attention=True)
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
        _C.golden_forward(q, k, v, o, lse, recipe, softmax_scale, causal)
    return o, lse


@attn_fwd.register_fake
def _(q, k, v, recipe, softmax_scale, causal, d_source="forward-o"):
    return _outputs(q.shape, q.dtype, q.device)


# ---- kernel operands --------------------------------------------------------------------------


@torch.library.custom_op("fp4attn::quantize_operand", mutates_args=())
def quantize_operand(
    x: Tensor, recipe: str, role: str, tensor_scale: float
) -> tuple[Tensor, Tensor]:
    """The kernel operand (data, scale) of a BSHD input for `role` in ('q', 'k', 'v')."""
    data_shape, scale_shape = operand_shapes(x.shape, role)
    data = torch.empty(data_shape, dtype=operand_dtype(recipe), device=x.device)
    scale = torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    if x.device.type == "cuda":
        require_cuda_build(role, attention=False)
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
        x.new_empty(data_shape, dtype=operand_dtype(recipe)),
        x.new_empty(scale_shape, dtype=torch.float32),
    )


def _v_positions(s: int, device) -> Tensor:
    """Position of each key 0..s-1 in its V^T row (operands.h operand_v_position_of)."""
    key = torch.arange(s, device=device)
    k = key & 15
    return (key & ~15) + 4 * ((k >> 1) & 3) + (k & 1) + 2 * (k >> 3)


def dequantize_operand(data: Tensor, scale: Tensor, role: str, seqlen: int) -> Tensor:
    """BSHD float64 values of an operand: data x its scale (operands.h). Exact: a code of at most
    8 significant bits times an FP32 scale fits in float64's 53."""
    data = data.double()
    if role == "v":  # data [b, h, d, pitch] with keys permuted, scale per channel [b, h, d]
        values = data.index_select(3, _v_positions(seqlen, data.device)) * scale.double()[..., None]
        return values.permute(0, 3, 1, 2)
    # data [b, h, s, d], scale [b, h, tiles] for 128-token tiles
    row_scale = scale.double().repeat_interleave(SCALE_TILE, dim=2)[:, :, :seqlen, None]
    return (data * row_scale).transpose(1, 2)


@torch.library.custom_op("fp4attn::fake_quantize", mutates_args=())
def fake_quantize(
    x: Tensor, recipe: str, role: str, tensor_scale: float, out_dtype: torch.dtype
) -> Tensor:
    """x's operand values for `role` (what the recipe's forward multiplies), BSHD, out_dtype."""
    # The forward reads its inputs as FP32 values (numerics.md §1); so does the quantizer here.
    src = x if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x.float()
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
        require_cuda_build("q_data", attention=True)
        with torch.cuda.device(q_data.device):
            run_cuda(_C.attention_operands_cuda, *args, cuda_stream(q_data.device))
    else:
        _C.attention_operands_host(*args)
    return o, lse


@attn_operands_fwd.register_fake
def _(q_data, q_scale, k_data, k_scale, v_data, v_scale, recipe, softmax_scale, causal, out_dtype):
    b, h, s_q, d = q_data.shape
    return _outputs((b, s_q, h, d), out_dtype, q_data.device)


# ---- packed FP4 storage (plain functions: the ring's wire format, fp4attn.distributed) ---------

PACKED_BLOCK = {"nvfp4": 16, "mxfp4": 32}  # values per scale along the last dim


def quantize_packed_into(x: Tensor, fmt: str, rule: str, packed, scales, s_enc_out) -> None:
    """Packed FP4 of a BSHD tensor into packed U8 [b, s, h, d / 2] and row-major scales U8
    [b, s, h, d / block] (include/fp4attn/quantize_cuda.h). NVFP4: the tensor scale s_enc comes
    from x's amax and is written to s_enc_out (F32 [1]); MXFP4: s_enc_out is None."""
    if x.device.type == "cuda":
        require_cuda_build("x", attention=False)
        with torch.cuda.device(x.device):
            run_cuda(
                _C.quantize_packed_cuda,
                x, fmt, rule, 0.0, packed, scales, s_enc_out, cuda_stream(x.device),
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
    data = torch.empty((b, h, s, 2 * half), dtype=E4M3, device=packed.device)
    scale = torch.empty((b, h, (s + SCALE_TILE - 1) // SCALE_TILE), dtype=torch.float32,
                        device=packed.device)
    args = (packed, scales, fmt, s_enc, recipe, role, as_codes(data), scale)
    if packed.device.type == "cuda":
        require_cuda_build("packed", attention=False)
        with torch.cuda.device(packed.device):
            run_cuda(_C.repack_to_operand_cuda, *args, cuda_stream(packed.device))
    else:
        run_cuda(_C.repack_to_operand_host, *args)
    return data, scale


# ---- backward (CPU: the golden model; CUDA: the GPU backward of the exp2 recipes) ---------------

# The recipes whose backward runs on the GPU (docs/kernels/bwd_sm90.md).
GPU_BACKWARD_RECIPES = ("fp8", "nvfp4", "nvfp4-hx", "mxfp4")


def _attn_bwd_cuda(dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source):
    require_cuda_build("q", attention=True)
    if recipe not in GPU_BACKWARD_RECIPES:
        raise UnsupportedError(
            f"recipe: '{recipe}' has no GPU backward yet (it has: "
            f"{', '.join(GPU_BACKWARD_RECIPES)}); run attn_func on CPU tensors for its gradients"
        )
    # BF16 gradients come straight from the kernel (RNE of its FP32 sums); FP16 ones via FP32.
    gdt = torch.bfloat16 if q.dtype == torch.bfloat16 else torch.float32
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
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of attn_fwd, in q's dtype, from what the forward saved (o, lse).

    dlse, the gradient reaching the LSE output, must be None or all zero: the LSE is not
    differentiated (a nonzero one raises UnsupportedError rather than being dropped). CUDA
    tensors: the GPU backward (exp2 recipes; 'high-precision-o' needs its v2 kernel, the default;
    deterministic when torch.use_deterministic_algorithms is on); CPU tensors: the golden model."""
    if dlse is not None and bool(dlse.ne(0).any()):
        raise UnsupportedError(
            "lse: fp4attn's backward differentiates o only; a loss that depends on the returned "
            "lse (nonzero gradient reaching it) is not supported"
        )
    if q.device.type == "cuda":
        return _attn_bwd_cuda(dout, q, k, v, o, lse, recipe, softmax_scale, causal, d_source)
    if q.device.type != "cpu":
        raise UnsupportedError(f"q: on {q.device}: fp4attn's backward runs on CUDA or CPU tensors")
    # The golden model writes float32 (float64 for float64 inputs) and we cast to q's dtype.
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.empty(q.shape, dtype=acc)
    dk = torch.empty(k.shape, dtype=acc)
    dv = torch.empty(v.shape, dtype=acc)
    _C.golden_backward(q, k, v, o, dout, lse, dq, dk, dv, recipe, softmax_scale, causal, d_source)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@attn_bwd.register_fake
def _(dout, q, k, v, o, lse, dlse, recipe, softmax_scale, causal, d_source):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _attn_setup_context(ctx, inputs, output):
    q, k, v, recipe, softmax_scale, causal, d_source = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = (recipe, softmax_scale, causal, d_source)
    # An unused LSE output then reaches the backward as None, not as a zero tensor whose check
    # (attn_bwd: any nonzero?) would cost a fill, a reduction and a device sync every call.
    ctx.set_materialize_grads(False)


def _attn_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    recipe, softmax_scale, causal, d_source = ctx.options
    if grad_o is None:  # only the LSE was used: its gradient is refused below, or zero
        grad_o = torch.zeros_like(o)
    dq, dk, dv = attn_bwd(
        grad_o.contiguous(), q, k, v, o, lse, grad_lse, recipe, softmax_scale, causal, d_source
    )
    return dq, dk, dv, None, None, None, None


attn_fwd.register_autograd(_attn_backward, setup_context=_attn_setup_context)


# ---- no backward over kernel operands ---------------------------------------------------------


def _no_backward(ctx, *grads):
    raise NotImplementedError(
        "fp4attn: attn_quantized has no backward (its inputs are quantized codes, which are not "
        "differentiable); use attn_func, whose backward runs on CPU tensors, or run under "
        "torch.no_grad()/torch.inference_mode()"
    )


def _no_context(ctx, inputs, output):
    pass


attn_operands_fwd.register_autograd(_no_backward, setup_context=_no_context)

__all__ = ["attn_bwd", "attn_fwd", "attn_operands_fwd", "fake_quantize", "quantize_operand"]
