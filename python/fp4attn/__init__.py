"""fp4attn: FP4/FP8 attention for PyTorch (NVIDIA Hopper kernels, a CPU golden model).

    o = fp4attn.attn_func(q, k, v, causal=True)   # the default recipe, fp8
    o = fp4attn.attn_func(q, k, v, causal=True, recipe="nvfp4")

CPU tensors run on the golden model (the bit-exact definition of every recipe, slow); CUDA
tensors on the GPU kernels. See docs/python.md.
"""

from . import _version

# The drop-in shims (docs/dropin.md), reachable as fp4attn.flash_attn and so on.
from . import flash_attn as flash_attn
from . import flash_attn_interface as flash_attn_interface
from . import sdpa as sdpa
from ._defaults import get_default_recipe, set_default_recipe, use_recipe
from ._layout import RECIPES
from ._native import _C, UnsupportedError
from .api import attn_func, attn_quantized, fake_quantize, quantize_qkv
from .paged import DecodePlan, PagedKVCache, append_kv, decode
from .quantized import QuantizedQKV, quantize_q
from .sage import sageattn
from .sdpa import scaled_dot_product_attention
from .varlen import attn_varlen_func

__version__ = _version.__version__


def cuda_available() -> bool:
    """Whether attention on CUDA tensors can run: a GPU is visible and this build has the CUDA
    kernels compiled in (the device itself must also be a Hopper, see check_forward_device)."""
    import torch

    return bool(_C.has_cuda() and torch.cuda.is_available())


__all__ = [
    "RECIPES",
    "DecodePlan",
    "PagedKVCache",
    "QuantizedQKV",
    "UnsupportedError",
    "append_kv",
    "attn_func",
    "attn_quantized",
    "attn_varlen_func",
    "cuda_available",
    "decode",
    "fake_quantize",
    "get_default_recipe",
    "quantize_q",
    "quantize_qkv",
    "sageattn",
    "scaled_dot_product_attention",
    "set_default_recipe",
    "use_recipe",
]
