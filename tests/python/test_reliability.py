"""Zero-size inputs and numpy scalars at the package's border (issue 26, findings 7 and 11)."""

import numpy as np
import pytest
import torch

import fp4attn

RECIPES = ("bf16", "fp8", "nvfp4", "nvfp4-all", "fp4-direct")


def empty_k_qkv(d=64):
    """q with tokens, k and v with none: shape (1, 0, 2, 64) as torch lays it out (its strides
    (128, 64, 64, 1) are not those of a contiguous non-empty tensor)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 2, d, generator=g).bfloat16()
    k = torch.empty(1, 0, 2, d, dtype=torch.bfloat16)
    return q, k, torch.empty_like(k)


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantize_qkv_takes_an_empty_k_like_attn_func(recipe):
    q, k, v = empty_k_qkv()
    o = fp4attn.attn_func(q, k, v, recipe=recipe)
    qkv = fp4attn.quantize_qkv(q, k, v, recipe=recipe)
    assert qkv.k_data.shape == (1, 2, 0, 64)
    assert qkv.v_data.shape[3] == 0
    oq = fp4attn.attn_quantized(qkv)
    # No key: O is 0 in both (numerics.md's rows without keys).
    assert torch.equal(oq, o)
    assert torch.count_nonzero(o.float()) == 0


@pytest.mark.parametrize("role", ("q", "k", "v"))
def test_fake_quantize_takes_an_empty_tensor(role):
    _, k, _ = empty_k_qkv()
    out = fp4attn.fake_quantize(k, recipe="nvfp4", role=role)
    assert out.shape == k.shape and out.dtype == k.dtype


def test_quantize_q_takes_an_empty_q():
    q = torch.empty(2, 0, 4, 128, dtype=torch.float16)
    data, scale = fp4attn.quantize_q(q, recipe="fp8")
    assert data.shape == (2, 4, 0, 128) and scale.shape == (2, 4, 0)


def test_numpy_bool_is_named_as_such():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 2, 64, generator=g)
    with pytest.raises(
        TypeError, match=r"^causal: expected a bool, got numpy\.bool_; pass bool\(causal\)$"
    ):
        fp4attn.attn_func(q, q, q, causal=np.bool_(True))
    with pytest.raises(TypeError, match=r"^return_lse: expected a bool, got numpy\.bool_"):
        fp4attn.attn_func(q, q, q, return_lse=np.False_)
    # Other types keep their plain names.
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got int$"):
        fp4attn.attn_func(q, q, q, causal=1)
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got torch\.Tensor$"):
        fp4attn.attn_func(q, q, q, causal=torch.tensor(True))
