"""The torch.library side: opcheck of the custom ops (schema, fake kernels, autograd
registration, AOT dispatch), meta tensors, torch.compile, forward and backward."""

import pytest
import torch

import fp4attn
from fp4attn import _ops
from package_util import qkv


def op_samples(device="cpu", dtype=torch.float32):
    q, k, v = qkv(s_q=48, s_k=80, h=4, h_kv=2, d=64, dtype=dtype, device=device)
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    return [
        (_ops.attn_fwd, (q, k, v, "fp8", 0.0, True)),
        (
            _ops.attn_fwd,
            (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, "nvfp4", 0.2, False),
        ),
        (_ops.quantize_operand, (q, "nvfp4", "q", 0.0)),
        (_ops.quantize_operand, (v, "fp8", "v", 0.0)),
        (_ops.quantize_operand, (k, "bf16", "k", 0.0)),
        (
            _ops.attn_operands_fwd,
            (
                ops.q_data,
                ops.q_scale,
                ops.k_data,
                ops.k_scale,
                ops.v_data,
                ops.v_scale,
                "fp8",
                0.0,
                False,
                dtype,
            ),
        ),
    ]


# opcheck's test_schema compares inputs arithmetically, which torch has no CPU kernel for in
# float8 ("mul_cpu_reduced_float"); the op over FP8 operands runs the other three checks.
FP8_INPUT_CHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("index", range(6))
def test_opcheck(index):
    op, args = op_samples()[index]
    fp8_inputs = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    torch.library.opcheck(op, args, test_utils=FP8_INPUT_CHECKS if fp8_inputs else "ALL")


def test_meta_tensors_run_the_fake_kernels():
    q, k, v = (torch.empty(2, 300, 8, 128, device="meta", dtype=torch.bfloat16) for _ in range(3))
    o, lse = fp4attn.attn_func(q, k[:, :, :2], v[:, :, :2], return_lse=True)
    assert o.device.type == "meta" and o.shape == q.shape and o.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32
    ops = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4")
    assert ops.q_data.shape == (2, 8, 300, 128) and ops.q_scale.shape == (2, 8, 3)
    assert ops.v_data.shape == (2, 8, 128, 304) and ops.v_scale.shape == (2, 8, 128)
    assert fp4attn.attn_quantized(ops).shape == q.shape


def test_torch_compile_fullgraph():
    q, k, v = qkv(s_q=64, d=64)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def block(q, k, v):
        return fp4attn.attn_func(q * 1.0, k, v, causal=True, recipe="fp8") + 1.0

    torch.testing.assert_close(
        block(q, k, v), fp4attn.attn_func(q, k, v, causal=True, recipe="fp8") + 1.0, rtol=0, atol=0
    )


def test_backward_runs_eagerly_and_under_torch_compile():
    q, k, v = qkv(s_q=32, s_k=48, h=4, h_kv=2, d=64)
    grads = []
    for compiled in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

        def block(q, k, v):
            return fp4attn.attn_func(q * 1.0, k, v, causal=True, recipe="fp8").square().sum()

        fn = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for g, t in zip(grads[0], (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and bool(g.abs().sum() > 0)
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_inference_mode():
    q, k, v = qkv(s_q=32, d=64)
    with torch.inference_mode():
        o = fp4attn.attn_func(q, k, v, recipe="fp8")
    assert not o.requires_grad
