"""fp4attn's Python API on CPU tensors (the golden model): accuracy against float64 SDPA within
each recipe's documented error, layouts, GQA, causal, LSE and the quantize-once path."""

import pytest
import torch

import fp4attn
from package_util import QUANTIZED_RECIPES, lse_ref, qkv, rel_l2, sdpa_bshd, tolerance


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_every_recipe_within_documented_error(recipe):
    q, k, v = qkv(s_q=256, d=128)
    o = fp4attn.attn_func(q, k, v, recipe=recipe)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert rel_l2(o, sdpa_bshd(q, k, v)) < tolerance(recipe)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_input_dtypes_give_the_same_result(dtype):
    q, k, v = qkv(s_q=128, d=64)
    ref = fp4attn.attn_func(q, k, v, recipe="fp8")
    o = fp4attn.attn_func(q.to(dtype), k.to(dtype), v.to(dtype), recipe="fp8")
    assert o.dtype == dtype
    # Inputs are BF16-exact, so only the output rounding differs.
    torch.testing.assert_close(o.float(), ref, rtol=1e-2, atol=1e-2)


def test_causal_bottom_right_and_lse():
    q, k, v = qkv(s_q=96, s_k=200, d=64)
    o, lse = fp4attn.attn_func(q, k, v, causal=True, recipe="fp8", return_lse=True)
    assert lse.shape == (1, 4, 96) and lse.dtype == torch.float32
    assert rel_l2(o, sdpa_bshd(q, k, v, causal=True)) < tolerance("fp8")
    torch.testing.assert_close(lse.double(), lse_ref(q, k, causal=True), rtol=0, atol=0.05)


def test_rows_without_keys_are_zero_with_infinite_lse():
    q, k, v = qkv(s_q=64, s_k=16, d=64)  # causal with s_q > s_k: the first 48 rows see nothing
    o, lse = fp4attn.attn_func(q, k, v, causal=True, recipe="fp8", return_lse=True)
    assert torch.all(o[:, :48] == 0)
    assert torch.all(torch.isinf(lse[:, :, :48]))
    assert torch.all(torch.isfinite(lse[:, :, 48:]))


def test_gqa_matches_repeated_kv():
    q, k, v = qkv(s_q=128, h=8, h_kv=2, d=64)
    o = fp4attn.attn_func(q, k, v, recipe="nvfp4")
    rep = (t.repeat_interleave(4, dim=2) for t in (k, v))
    torch.testing.assert_close(o, fp4attn.attn_func(q, *rep, recipe="nvfp4"), rtol=0, atol=0)


def test_bhsd_layout_is_the_transposed_call():
    q, k, v = qkv(s_q=128, d=64)
    o, lse = fp4attn.attn_func(q, k, v, recipe="nvfp4", return_lse=True)
    t = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    o2, lse2 = fp4attn.attn_func(*t, recipe="nvfp4", layout="bhsd", return_lse=True)
    assert o2.shape == t[0].shape
    torch.testing.assert_close(o2.transpose(1, 2), o, rtol=0, atol=0)
    torch.testing.assert_close(lse2, lse, rtol=0, atol=0)


def test_softmax_scale():
    q, k, v = qkv(s_q=128, d=64)
    o = fp4attn.attn_func(q, k, v, softmax_scale=0.3, recipe="bf16")
    assert rel_l2(o, sdpa_bshd(q, k, v, scale=0.3)) < tolerance("bf16")
    default = fp4attn.attn_func(q, k, v, recipe="bf16")
    torch.testing.assert_close(
        fp4attn.attn_func(q, k, v, softmax_scale=64**-0.5, recipe="bf16"),
        default,
        rtol=1e-6,
        atol=1e-6,
    )


def test_non_contiguous_inputs_with_contiguous_head_dim():
    q, k, v = qkv(s_q=128, d=64)
    wide = torch.zeros(1, 128, 8, 64)
    wide[:, :, ::2] = q  # heads every other slot: strides (65536, 512, 128, 1)
    o = fp4attn.attn_func(wide[:, :, ::2], k, v, recipe="fp8")
    torch.testing.assert_close(o, fp4attn.attn_func(q, k, v, recipe="fp8"), rtol=0, atol=0)


def test_empty_inputs():
    q, k, v = qkv(s_q=0, s_k=0, d=64)
    o, lse = fp4attn.attn_func(q, k, v, return_lse=True)
    assert o.shape == (1, 0, 4, 64) and lse.shape == (1, 4, 0)


@pytest.mark.parametrize("recipe", QUANTIZED_RECIPES)
@pytest.mark.parametrize("causal", [False, True])
def test_quantized_path_is_bit_identical_on_cpu(recipe, causal):
    q, k, v = qkv(s_q=80, s_k=144, h=4, h_kv=2, d=64, dtype=torch.bfloat16)
    o, lse = fp4attn.attn_func(q, k, v, causal=causal, recipe=recipe, return_lse=True)
    ops = fp4attn.quantize_qkv(q, k, v, recipe=recipe)
    o2, lse2 = fp4attn.attn_quantized(ops, causal=causal, return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


def test_quantized_operands_have_the_kernel_layouts():
    q, k, v = qkv(s_q=200, s_k=130, h=4, h_kv=2, d=128, dtype=torch.bfloat16)
    ops = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4")
    assert isinstance(ops, fp4attn.QuantizedQKV)
    assert ops.q_data.shape == (1, 4, 200, 128) and ops.q_data.dtype == torch.float8_e4m3fn
    assert ops.q_scale.shape == (1, 4, 2) and ops.q_scale.dtype == torch.float32
    assert ops.k_data.shape == (1, 2, 130, 128) and ops.k_scale.shape == (1, 2, 2)
    assert ops.v_data.shape == (1, 2, 128, 144) and ops.v_scale.shape == (1, 2, 128)
    assert ops.out_dtype == torch.bfloat16 and ops.recipe == "nvfp4" and ops.head_dim == 128
    bf = fp4attn.quantize_qkv(q, k, v, recipe="bf16")
    assert bf.q_data.dtype == torch.bfloat16


def test_replace_q_reuses_kv():
    q, k, v = qkv(s_q=64, s_k=128, d=64, dtype=torch.bfloat16)
    q2 = qkv(s_q=64, s_k=128, d=64, dtype=torch.bfloat16, seed=1)[0]
    ops = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4", layout="bshd")
    o = fp4attn.attn_quantized(ops.replace_q(q2))
    torch.testing.assert_close(o, fp4attn.attn_func(q2, k, v, recipe="nvfp4"), rtol=0, atol=0)


def test_quantized_bhsd_output_layout():
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv(s_q=64, d=64))
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8", layout="bhsd")
    o = fp4attn.attn_quantized(ops)
    torch.testing.assert_close(
        o, fp4attn.attn_func(q, k, v, recipe="fp8", layout="bhsd"), rtol=0, atol=0
    )


def test_static_tensor_scale_changes_nvfp4_operands():
    q, k, v = qkv(s_q=64, d=64)
    a = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4")
    b = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4", q_tensor_scale=100.0)
    assert torch.equal(a.k_data.view(torch.uint8), b.k_data.view(torch.uint8))
    torch.testing.assert_close(b.q_scale, torch.full_like(b.q_scale, 8 / 100.0))


@pytest.mark.parametrize("recipe", ["int8", "int8-fast"])
def test_quantize_qkv_refuses_the_recipes_that_smooth_k(recipe):
    q, k, v = qkv(s_q=64, d=64)
    with pytest.raises(fp4attn.UnsupportedError, match="smooths K"):
        fp4attn.quantize_qkv(q, k, v, recipe=recipe)
