"""QuantizedQKV: the kernel operands of one attention call, so K/V can be quantized once and
reused (e.g. a prefix cache, or every decoding step against a fixed context); quantize_q, the Q
operand alone."""

from __future__ import annotations

import dataclasses

import torch

from . import _checks, _defaults, _layout, _ops


@dataclasses.dataclass(frozen=True)
class QuantizedQKV:
    """Operands in the layouts of include/fp4attn/operands.h (the kernels' own layouts):

    * q_data [b, h, s_q, d], k_data [b, h_kv, s_k, d]: float8_e4m3fn (bfloat16 for "bf16"),
      block scales folded in; q_scale / k_scale float32 [b, heads, ceil(s / 128)];
    * v_data [b, h_kv, d, s_k rounded up to 16] (V transposed, keys permuted within groups of
      16), v_scale float32 [b, h_kv, d].

    recipe, out_dtype (the dtype of the inputs and of attn_quantized's output) and layout (of
    the inputs, and so of the output) are what quantize_qkv was called with; tensor_scales its
    static NVFP4 encode scales (q, k, v; 0.0 = computed per (batch, head)).

    sources: the q, k, v (in `layout`) the operands were quantized from, kept by quantize_qkv when
    grad mode is on and one of them requires grad, else None. With them attn_quantized is
    differentiable with respect to q, k, v (straight through the quantizers; docs/python.md
    "Autograd"). They must be what the operands were made from (with tensor_scales): the CPU
    backward quantizes them again, the CUDA backward reads the operands. They keep q, k, v (and
    the graph that made them) alive as long as this object lives.
    """

    q_data: torch.Tensor
    q_scale: torch.Tensor
    k_data: torch.Tensor
    k_scale: torch.Tensor
    v_data: torch.Tensor
    v_scale: torch.Tensor
    recipe: str
    out_dtype: torch.dtype
    layout: str = "bshd"
    sources: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    tensor_scales: tuple[float, float, float] = (0.0, 0.0, 0.0)

    TENSORS = ("q_data", "q_scale", "k_data", "k_scale", "v_data", "v_scale")

    @property
    def device(self) -> torch.device:
        return self.q_data.device

    @property
    def head_dim(self) -> int:
        return self.q_data.shape[3]

    @property
    def differentiable(self) -> bool:
        """Whether attn_quantized (with grad mode on) gives gradients to the sources."""
        return self.sources is not None and any(t.requires_grad for t in self.sources)

    def to(self, device: torch.device | str) -> QuantizedQKV:
        """The operands on another device (CPU and GPU quantizers write the same bytes).

        The sources move with them (Tensor.to, which autograd records: gradients still reach the
        original q, k, v); never are sources left on another device than the operands."""
        moved = {f: getattr(self, f).to(device) for f in self.TENSORS}
        if self.sources is not None:
            moved["sources"] = tuple(t.to(device) for t in self.sources)
        return dataclasses.replace(self, **moved)

    def replace_q(self, q: torch.Tensor, tensor_scale: float | None = None) -> QuantizedQKV:
        """The same K/V with a new q (same recipe and layout) quantized in.

        With sources, q replaces the q source (gradients then flow to the new q and the old
        k, v); without, the result has none either."""
        q_data, q_scale = quantize_q(
            q, recipe=self.recipe, layout=self.layout, tensor_scale=tensor_scale
        )
        _, k_scale, v_scale = self.tensor_scales
        q_scale_static = 0.0 if tensor_scale is None else float(tensor_scale)
        sources = None if self.sources is None else (q, *self.sources[1:])
        return dataclasses.replace(
            self,
            q_data=q_data,
            q_scale=q_scale,
            out_dtype=q.dtype,
            sources=sources,
            tensor_scales=(q_scale_static, k_scale, v_scale),
        )


def quantize_q(
    q: torch.Tensor,
    recipe: str | None = None,
    layout: str = "bshd",
    tensor_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Q operand alone (q_data, q_scale), e.g. a new query against quantized K/V."""
    _checks.check_layout(layout)
    recipe = _defaults.resolve(recipe)
    dims = (
        "(batch, seqlen_q, heads, head_dim)"
        if layout == "bshd"
        else "(batch, heads, seqlen_q, head_dim)"
    )
    _checks.check_tensor(q, "q", 4, dims)
    _checks.check_device(q, "q", q, "q")
    _checks.check_input_dtype(q, "q")
    _checks.check_quantize_dtype(q, "q")
    _checks.check_last_dim_contiguous(q, "q")
    _checks.check_head_dim(q.shape[3], "q")
    scale = _checks.check_tensor_scale(tensor_scale, "tensor_scale")
    return _ops.quantize_operand(_layout.to_bshd(q, layout), recipe, "q", scale)
