"""torch.library custom ops over the extension, with fake (meta) kernels for torch.compile and
CUDA graphs. Tensors here are BSHD; layouts and argument checks live in api.py.

Each op allocates its outputs with torch and lets the extension fill them: on CPU through the
golden model, on CUDA through the kernels, on the current stream (no synchronization, so the ops
can be captured in a CUDA graph).
"""

import torch
from torch import Tensor

from ._native import _C, as_codes, cuda_stream, require_cuda_build, run_cuda

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
    q: Tensor, k: Tensor, v: Tensor, recipe: str, softmax_scale: float, causal: bool
) -> tuple[Tensor, Tensor]:
    """Forward attention, BSHD. softmax_scale 0 means 1/sqrt(head_dim). Returns (o, lse)."""
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
def _(q, k, v, recipe, softmax_scale, causal):
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


# ---- autograd: forward only -------------------------------------------------------------------


def _no_backward(ctx, *grads):
    raise NotImplementedError(
        "fp4attn: the backward pass is not implemented yet (forward only); run fp4attn under "
        "torch.no_grad()/torch.inference_mode(), or use torch.nn.functional."
        "scaled_dot_product_attention where gradients are needed"
    )


def _no_context(ctx, inputs, output):
    pass


for _op in (attn_fwd, attn_operands_fwd):
    _op.register_autograd(_no_backward, setup_context=_no_context)

__all__ = ["attn_fwd", "attn_operands_fwd", "quantize_operand"]
