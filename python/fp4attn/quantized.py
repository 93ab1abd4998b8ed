"""QuantizedQKV: the kernel operands of one attention call, so K/V can be quantized once and
reused (e.g. a prefix cache, or every decoding step against a fixed context)."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class QuantizedQKV:
    """Operands in the layouts of include/fp4attn/operands.h (the kernels' own layouts):

    * q_data [b, h, s_q, d], k_data [b, h_kv, s_k, d]: float8_e4m3fn (bfloat16 for "bf16"),
      block scales folded in; q_scale / k_scale float32 [b, heads, ceil(s / 128)];
    * v_data [b, h_kv, d, s_k rounded up to 16] (V transposed, keys permuted within groups of
      16), v_scale float32 [b, h_kv, d].

    recipe, out_dtype (the dtype of the inputs and of attn_quantized's output) and layout (of
    the inputs, and so of the output) are what quantize_qkv was called with.
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

    TENSORS = ("q_data", "q_scale", "k_data", "k_scale", "v_data", "v_scale")

    @property
    def device(self) -> torch.device:
        return self.q_data.device

    @property
    def head_dim(self) -> int:
        return self.q_data.shape[3]

    def to(self, device: torch.device | str) -> QuantizedQKV:
        """The operands on another device (CPU and GPU quantizers write the same bytes)."""
        return dataclasses.replace(self, **{f: getattr(self, f).to(device) for f in self.TENSORS})

    def replace_q(self, q: torch.Tensor, tensor_scale: float | None = None) -> QuantizedQKV:
        """The same K/V with a new q (same recipe and layout) quantized in."""
        from .api import quantize_q  # api imports this module

        q_data, q_scale = quantize_q(
            q, recipe=self.recipe, layout=self.layout, tensor_scale=tensor_scale
        )
        return dataclasses.replace(self, q_data=q_data, q_scale=q_scale, out_dtype=q.dtype)
