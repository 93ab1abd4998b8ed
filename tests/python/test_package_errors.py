"""Bad input raises TypeError/ValueError naming the argument, before anything runs."""

import numpy as np
import pytest
import torch

import fp4attn
from package_util import qkv


def call(q, k, v, **kw):
    return fp4attn.attn_func(q, k, v, **kw)


@pytest.fixture
def good():
    return qkv(s_q=16, d=64)


def test_not_a_tensor(good):
    q, k, v = good
    with pytest.raises(TypeError, match="^k: expected a torch.Tensor, got ndarray"):
        call(q, k.numpy(), v)


def test_wrong_rank(good):
    q, k, v = good
    with pytest.raises(
        ValueError, match=r"^q: expected rank 4 \(batch, seqlen_q, heads, head_dim\)"
    ):
        call(q[0], k, v)
    with pytest.raises(ValueError, match=r"^v: expected rank 4 \(batch, kv_heads, seqlen_k"):
        call(q.transpose(1, 2), k.transpose(1, 2), v[0], layout="bhsd")


def test_unsupported_dtype(good):
    q, k, v = good
    with pytest.raises(TypeError, match="^q: dtype torch.int32 is not supported on CPU"):
        call(q.int(), k, v)


def test_mixed_dtypes(good):
    q, k, v = good
    with pytest.raises(TypeError, match="^v: dtype torch.float16 differs from q's torch.float32"):
        call(q, k, v.half())


def test_float64_is_cpu_only_for_quantize(good):
    q, k, v = (t.double() for t in good)
    assert fp4attn.attn_func(q, k, v, recipe="fp8").dtype == torch.float64
    with pytest.raises(TypeError, match="^q: dtype torch.float64 is not supported by quantize_qkv"):
        fp4attn.quantize_qkv(q, k, v)


def test_mismatched_devices(good):
    q, k, v = good
    with pytest.raises(ValueError, match="^k: on meta, but q is on cpu"):
        call(q, k.to("meta"), v)


def test_head_dim(good):
    q, k, v = (torch.zeros(1, 16, 4, 80) for _ in range(3))
    with pytest.raises(
        ValueError, match=r"^q: head_dim 80 is not supported \(supported: 64, 128\)"
    ):
        call(q, k, v)


def test_shapes(good):
    q, k, v = good
    with pytest.raises(ValueError, match="^k: expected batch 1 and head_dim 64 like q"):
        call(q, torch.zeros(2, 16, 4, 64), v)
    with pytest.raises(ValueError, match=r"^v: expected shape \(1, 16, 4, 64\) like k"):
        call(q, k, torch.zeros(1, 17, 4, 64))
    with pytest.raises(ValueError, match="^q/k: number of heads 4 is not a multiple of kv heads 3"):
        call(q, torch.zeros(1, 16, 3, 64), torch.zeros(1, 16, 3, 64))


def test_non_contiguous_head_dim(good):
    q, _, v = good
    strided = torch.zeros(1, 16, 4, 128)[..., ::2]
    with pytest.raises(ValueError, match=r"^k: the last dimension \(head_dim\) must be contiguous"):
        call(q, strided, v)


def test_scalar_arguments(good):
    q, k, v = good
    with pytest.raises(ValueError, match="^recipe: unknown recipe 'fp5' "):
        call(q, k, v, recipe="fp5")
    with pytest.raises(TypeError, match="^recipe: expected a str"):
        call(q, k, v, recipe=3)
    with pytest.raises(ValueError, match="^layout: expected 'bshd' or 'bhsd', got 'sbhd'"):
        call(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match="^softmax_scale: expected a finite value > 0, got -1"):
        call(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="^softmax_scale: expected a finite value > 0, got nan"):
        call(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="^causal: expected a bool"):
        call(q, k, v, causal="yes")


def test_quantized_arguments(good):
    q, k, v = good
    with pytest.raises(TypeError, match="^qkv: expected a QuantizedQKV"):
        fp4attn.attn_quantized((q, k, v))
    with pytest.raises(ValueError, match="^q_tensor_scale: expected a finite value > 0"):
        fp4attn.quantize_qkv(q, k, v, q_tensor_scale=-2.0)


def test_native_checks_name_the_operand(good):
    """Operands edited by hand reach the C++ checks, whose messages name them too."""
    import dataclasses

    q, k, v = good
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    bad = dataclasses.replace(ops, v_scale=ops.v_scale[:, :, :32].contiguous())
    with pytest.raises(
        ValueError, match=r"^v_scale: expected a contiguous float32 tensor of shape"
    ):
        fp4attn.attn_quantized(bad)
    with pytest.raises(TypeError, match="^q_data: expected dtype torch.bfloat16 for recipe 'bf16'"):
        fp4attn.attn_quantized(dataclasses.replace(ops, recipe="bf16"))


def test_cuda_tensors_without_a_cuda_build():
    if fp4attn._C.has_cuda() or not torch.cuda.is_available():
        pytest.skip("needs a GPU and a build without CUDA")
    q, k, v = qkv(s_q=16, d=64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(fp4attn.UnsupportedError, match="^q: this fp4attn build"):
        call(q, k, v)


def test_unsupported_error_is_both_kinds():
    assert issubclass(fp4attn.UnsupportedError, NotImplementedError)
    assert issubclass(fp4attn.UnsupportedError, ValueError)


def test_numpy_arrays_are_refused_with_a_type_error():
    x = np.zeros((1, 16, 4, 64), np.float32)
    with pytest.raises(TypeError, match="^q: expected a torch.Tensor"):
        fp4attn.attn_func(x, x, x)
