"""The CUDA path of attn_quantized's autograd (the GPU backward on the forward's own operands) and
of attn_func's smooth_k (runs on a machine with a Hopper GPU; skipped elsewhere).

* attn_quantized's gradients are attn_func's bit for bit in deterministic mode (the same operand
  bytes reach the same backward kernels; attn_func's backward quantizes them again);
* static tensor scales and CPU operands moved to the GPU reach the GPU backward;
* smooth_k on CUDA against the golden model on CPU (o, lse, gradients), its operands' bytes;
* every gradient element is written (a poisoned caching allocator), errors, opcheck.
"""

import contextlib

import pytest
import torch

import fp4attn
from fp4attn import _layout, _ops
from package_util import qkv, rel_l2, sdpa_bshd

pytestmark = [
    pytest.mark.skipif(
        not (torch.cuda.is_available() and fp4attn._C.has_cuda()),
        reason="needs a CUDA GPU and an fp4attn build with CUDA",
    ),
    pytest.mark.usefixtures("hopper"),  # conftest.py: skips unless the device runs the engine
]

GPU_BACKWARD_RECIPES = _layout.GPU_BACKWARD_RECIPES
# test_package_gpu.py's bounds: the engine against the golden model (forward), and the GPU
# backward's FP8 GEMM operands against the golden float64 gradients.
MAX_REL_L2_VS_GOLDEN = 0.015
MAX_LSE_ABS_VS_GOLDEN = 2e-3
MIN_GRAD_COS = 0.99
MAX_GRAD_REL_L2 = 0.15
STATIC = (0.5, 2.0, 0.25)  # q, k, v NVFP4 encode scales, far from the computed ones
SHAPES = {  # (b, s_q, s_k, h, h_kv, d): GQA, odd lengths, both head dims
    "gqa-d64": (2, 200, 333, 8, 2, 64),
    "mha-d128": (1, 129, 257, 4, 4, 128),
}


@contextlib.contextmanager
def deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def shaped_qkv(shape, dtype=torch.bfloat16, seed=0, device="cuda"):
    b, s_q, s_k, h, h_kv, d = shape
    q, k, v = qkv(b=b, s_q=s_q, s_k=s_k, h=h, h_kv=h_kv, d=d, seed=seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    return [t.to(dtype).to(device) for t in (q, k, v, dout)]


def leaves_of(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def func_grads(q, k, v, dout, **kw):
    leaves = leaves_of(q, k, v)
    o, lse = fp4attn.attn_func(*leaves, return_lse=True, **kw)
    o.backward(dout)
    return o.detach(), lse.detach(), *(t.grad for t in leaves)


def quantized_grads(q, k, v, dout, recipe, scales=(None, None, None), **kw):
    leaves = leaves_of(q, k, v)
    ops = fp4attn.quantize_qkv(
        *leaves,
        recipe=recipe,
        q_tensor_scale=scales[0],
        k_tensor_scale=scales[1],
        v_tensor_scale=scales[2],
    )
    assert ops.sources is not None
    o, lse = fp4attn.attn_quantized(ops, return_lse=True, **kw)
    o.backward(dout)
    return o.detach(), lse.detach(), *(t.grad for t in leaves)


def cos(x, y):
    x, y = x.double().flatten(), y.double().flatten()
    return float(x @ y / (x.norm() * y.norm()))


def assert_grads_close(got, want, what=""):
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        a = a.cpu()
        assert cos(a, b) >= MIN_GRAD_COS, f"{what}{name}: cos {cos(a, b):.5f}"
        assert rel_l2(a, b) <= MAX_GRAD_REL_L2, f"{what}{name}: rel-L2 {rel_l2(a, b):.4f}"


# ---- attn_quantized: the GPU backward on the saved operands ------------------------------------


@pytest.mark.parametrize("recipe", GPU_BACKWARD_RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_source", ["forward-o", "high-precision-o"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_attn_quantized_grads_equal_attn_func_bitwise(recipe, causal, d_source, shape):
    q, k, v, dout = shaped_qkv(shape)
    kw = {"causal": causal, "d_source": d_source}
    with deterministic():
        want = func_grads(q, k, v, dout, recipe=recipe, **kw)
        got = quantized_grads(q, k, v, dout, recipe, **kw)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.dtype == b.dtype and a.device.type == "cuda", name
        assert torch.equal(a, b), name
    assert got[2].dtype == torch.bfloat16
    assert all(bool(torch.isfinite(g).all()) for g in got[2:])


@pytest.mark.parametrize("recipe", ["nvfp4-fast", "fp4-direct", "nvfp4-all"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_follows_the_golden_model(recipe, causal):
    """nvfp4-fast and fp4-direct (P codes rebuilt from the forward's saved row_max) and nvfp4-all:
    attn_func's CUDA gradients against the CPU golden model's of the same recipe."""
    shape = SHAPES["mha-d128"]
    q, k, v, dout = shaped_qkv(shape, seed=9)
    got = func_grads(q, k, v, dout, recipe=recipe, causal=causal)
    want = func_grads(*(t.cpu().float() for t in (q, k, v, dout)), recipe=recipe, causal=causal)
    assert rel_l2(got[0].cpu(), want[0]) <= MAX_REL_L2_VS_GOLDEN
    assert_grads_close(got[2:], want[2:], f"{recipe}: ")


def test_attn_quantized_fp16_and_repeatable():
    q, k, v, dout = shaped_qkv(SHAPES["gqa-d64"], dtype=torch.float16, seed=2)
    with deterministic():
        want = func_grads(q, k, v, dout, recipe="nvfp4", causal=True)
        first = quantized_grads(q, k, v, dout, "nvfp4", causal=True)
        second = quantized_grads(q, k, v, dout, "nvfp4", causal=True)
    for name, a, b, w in zip(("dq", "dk", "dv"), first[2:], second[2:], want[2:]):
        assert a.dtype == torch.float16, name
        assert torch.equal(a, b), f"{name}: deterministic runs differ"
        assert torch.equal(a, w), name


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4-hx"])
def test_static_tensor_scales_match_the_golden_backward(recipe):
    """The static scales reach the GPU operands (same bytes as the CPU's) and so its backward:
    the gradients follow the CPU golden model's with the same scales."""
    shape = SHAPES["gqa-d64"]
    q, k, v, dout = shaped_qkv(shape, seed=3)
    cpu = [t.cpu().float() for t in (q, k, v, dout)]
    got = quantized_grads(q, k, v, dout, recipe, STATIC, causal=True)
    want = quantized_grads(*cpu, recipe, STATIC, causal=True)
    assert rel_l2(got[0].cpu(), want[0]) <= MAX_REL_L2_VS_GOLDEN
    assert_grads_close(got[2:], want[2:], "static scales: ")
    gpu_ops = fp4attn.quantize_qkv(q, k, v, recipe=recipe, q_tensor_scale=STATIC[0],
                                   k_tensor_scale=STATIC[1], v_tensor_scale=STATIC[2])  # fmt: skip
    cpu_ops = fp4attn.quantize_qkv(*cpu[:3], recipe=recipe, q_tensor_scale=STATIC[0],
                                   k_tensor_scale=STATIC[1], v_tensor_scale=STATIC[2])  # fmt: skip
    codes = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    for name in fp4attn.QuantizedQKV.TENSORS:
        a, b = getattr(gpu_ops, name).cpu(), getattr(cpu_ops, name)
        assert torch.equal(codes(a), codes(b)), name
    computed = quantized_grads(q, k, v, dout, recipe, causal=True)
    assert not torch.equal(computed[2], got[2])  # the scales changed the operands


def test_cpu_operands_moved_to_the_gpu_carry_their_sources():
    """quantize_qkv on CPU leaves, .to("cuda"): the GPU backward runs on the moved operands and
    the gradients come back to the CPU leaves (through the sources' Tensor.to)."""
    q, k, v, dout = shaped_qkv(SHAPES["gqa-d64"], seed=4)
    leaves = leaves_of(*(t.cpu() for t in (q, k, v)))
    ops = fp4attn.quantize_qkv(*leaves, recipe="fp8").to("cuda")
    assert all(t.device.type == "cuda" for t in ops.sources)
    with deterministic():
        fp4attn.attn_quantized(ops, causal=True).backward(dout)
        want = quantized_grads(q, k, v, dout, "fp8", causal=True)
    for leaf, w in zip(leaves, want[2:]):
        assert leaf.grad.device.type == "cpu"
        assert torch.equal(leaf.grad, w.cpu())


def test_varlen_grads_on_cuda_are_each_sequence_alone():
    """attn_varlen_func on CUDA (attn_func per sequence): each sequence's gradients are those of
    that sequence run alone, bit for bit (deterministic), for an exp2 and an exp-free recipe."""
    q, k, v, dout = shaped_qkv((1, 77, 150, 4, 2, 64), seed=12)
    q, k, v, dout = q[0], k[0], v[0], dout[0]  # packed [total, heads, d]
    cu_q = torch.tensor([0, 30, 77], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 61, 150], dtype=torch.int32, device="cuda")
    for recipe in ("nvfp4", "nvfp4-fast"):
        with deterministic():
            leaves = leaves_of(q, k, v)
            fp4attn.attn_varlen_func(*leaves, cu_q, cu_k, causal=True, recipe=recipe).backward(dout)
            for (q0, q1), (k0, k1) in zip(((0, 30), (30, 77)), ((0, 61), (61, 150))):
                want = func_grads(
                    q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1],
                    recipe=recipe, causal=True,
                )[2:]  # fmt: skip
                assert torch.equal(leaves[0].grad[q0:q1], want[0][0]), recipe
                assert torch.equal(leaves[1].grad[k0:k1], want[1][0]), recipe
                assert torch.equal(leaves[2].grad[k0:k1], want[2][0]), recipe


def test_backward_writes_every_gradient_element():
    """The caching allocator is filled with NaN first: a gradient element the backward does not
    write would come back NaN (1 MiB+ tensors reuse freed large blocks, smaller ones small)."""
    poison = [torch.full((4 << 20,), float("nan"), device="cuda") for _ in range(32)]
    poison += [torch.full((64 << 10,), float("nan"), device="cuda") for _ in range(256)]
    del poison
    shape = (2, 1000, 1000, 8, 2, 128)  # dq 4 MB in BF16, dk/dv 1 MB, smooth_k's F32 dK 2 MB
    q, k, v, dout = shaped_qkv(shape, seed=5)
    for name, out in (
        ("attn_quantized", quantized_grads(q, k, v, dout, "nvfp4", causal=True)),
        ("smooth_k", func_grads(q, k, v, dout, recipe="nvfp4", causal=True, smooth_k=True)),
    ):
        for what, t in zip(("o", "lse", "dq", "dk", "dv"), out):
            assert bool(torch.isfinite(t).all()), f"{name}: {what}"


def test_refusals():
    q, k, v, dout = shaped_qkv(SHAPES["gqa-d64"], seed=6)
    leaves = leaves_of(q, k, v)
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")  # no sources
    o = fp4attn.attn_quantized(ops.replace_q(leaves[0]))
    with pytest.raises(NotImplementedError, match=r"fp4attn.quantize_qkv\(q, k, v, ...\)"):
        o.backward(dout)
    o, lse = fp4attn.attn_quantized(fp4attn.quantize_qkv(*leaves, recipe="fp8"), return_lse=True)
    with pytest.raises(fp4attn.UnsupportedError, match="^lse: fp4attn's backward differentiates o"):
        lse.sum().backward()


def test_opcheck_cuda():
    q, k, v, dout = shaped_qkv(SHAPES["gqa-d64"], seed=7)
    leaves = leaves_of(q, k, v)
    ops = fp4attn.quantize_qkv(*leaves, recipe="nvfp4")
    operands = [getattr(ops, n).detach() for n in fp4attn.QuantizedQKV.TENSORS]
    checks = ("test_autograd_registration", "test_faketensor")  # FP8 inputs (test_package_gpu.py)
    args = (*leaves, *operands, "nvfp4", 0.0, True, torch.bfloat16, "high-precision-o",
            0.0, 0.0, 0.0, False)  # fmt: skip
    torch.library.opcheck(_ops.attn_quantized_fwd, args, test_utils=checks)
    o, lse, row_max = _ops.attn_quantized_fwd(*(t.detach() for t in leaves), *args[3:])
    bwd = (dout, o, lse, row_max, None, None, None, None, *operands, "nvfp4", 0.0, True,
           "high-precision-o", 0.0, 0.0, 0.0, True)  # fmt: skip
    torch.library.opcheck(_ops.attn_quantized_bwd, bwd, test_utils=checks)


# ---- smooth_k ----------------------------------------------------------------------------------


def mean_offset_qkv(shape, seed=0):
    """Gaussian q, k, v (BF16-exact) with four K channels offset by +-20: the mean smooth_k
    removes; the smoothed scores are Gaussian-like, the regime of test_package_gpu.py's bounds."""
    q, k, v, dout = shaped_qkv(shape, dtype=torch.float32, seed=seed, device="cpu")
    d = q.shape[3]
    for i in range(4):
        k[..., (2 * i + 1) * d // 8] += -20.0 if i % 2 else 20.0
    return [t.bfloat16().float() for t in (q, k, v, dout)]


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_smoothed_k_operand_and_mean_equal_the_cpu(recipe):
    _, k, _, _ = mean_offset_qkv(SHAPES["gqa-d64"])
    want = _ops.quantize_k_smoothed(k, recipe, 0.0)
    got = _ops.quantize_k_smoothed(k.bfloat16().cuda(), recipe, 0.0)
    for name, a, b in zip(("data", "scale", "mean"), got, want):
        a = a.cpu()
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), name


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_source", ["forward-o", "high-precision-o"])
def test_smooth_k_cuda_matches_the_golden_model(recipe, causal, d_source):
    cpu = mean_offset_qkv(SHAPES["gqa-d64"], seed=8)
    kw = {"recipe": recipe, "causal": causal, "d_source": d_source, "smooth_k": True}
    want = func_grads(*cpu, **kw)
    got = func_grads(*(t.cuda().bfloat16() for t in cpu), **kw)
    assert rel_l2(got[0].cpu(), want[0]) <= MAX_REL_L2_VS_GOLDEN
    lse, lse_want = got[1].cpu().double(), want[1].double()
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_want))
    finite = torch.isfinite(lse_want)
    err = (lse - lse_want)[finite].abs() - 2e-6 * lse_want[finite].abs()
    assert float(err.max()) <= MAX_LSE_ABS_VS_GOLDEN
    assert float(lse_want.abs().max()) > 2.0  # the q . mean term is in both
    assert_grads_close(got[2:], want[2:], "smooth_k: ")
    # dK of k - mean(k) sums to zero over the keys: here up to dK's BF16 rounding, whose sum
    # is at most 2^-9 * sqrt(s_k) = 0.036 of the column's norm.
    dk = got[3].double()
    assert bool((dk.sum(1).abs() <= 0.05 * dk.norm(dim=1) + 1e-12).all())
    # Without smoothing the GPU's o is much farther from attention of the inputs (measured on
    # the golden model: fp8 rel-L2 0.129 -> 0.054, nvfp4 0.54 -> 0.135).
    exact = sdpa_bshd(*cpu[:3], causal=causal)
    plain = fp4attn.attn_func(*(t.cuda().bfloat16() for t in cpu[:3]), recipe=recipe,
                              causal=causal)  # fmt: skip
    assert rel_l2(got[0].cpu(), exact) < 0.6 * rel_l2(plain.cpu(), exact)


def test_smooth_k_cuda_grads_equal_attn_quantized_with_mean_subtracted():
    """On CUDA, smooth_k's backward is the operand backward on the smoothed operands plus dK's
    mean subtraction: rebuilt by hand from the public ops, bit for bit (deterministic mode)."""
    cpu = mean_offset_qkv(SHAPES["gqa-d64"], seed=9)
    q, k, v, dout = (t.cuda().bfloat16() for t in cpu)
    with deterministic():
        o, lse, dq, dk, dv = func_grads(q, k, v, dout, recipe="nvfp4", causal=True, smooth_k=True)
        q_data, q_scale = _ops.quantize_operand(q, "nvfp4", "q", 0.0)
        k_data, k_scale, mean = _ops.quantize_k_smoothed(k, "nvfp4", 0.0)
        v_data, v_scale = _ops.quantize_operand(v, "nvfp4", "v", 0.0)
        operands = (q_data, q_scale, k_data, k_scale, v_data, v_scale)
        o2, lse_raw = _ops.attn_operands_fwd(*operands, "nvfp4", 0.0, True, torch.bfloat16)
        grads = [torch.empty(t.shape, dtype=torch.bfloat16, device="cuda") for t in (q, v)]
        dk32 = torch.empty(k.shape, dtype=torch.float32, device="cuda")
        fp4attn._C.attention_backward_operands_cuda(
            *(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in operands),
            o2, lse_raw, dout, grads[0], dk32, grads[1], "nvfp4", 0.0, True, True, "forward-o",
            torch.cuda.current_stream().cuda_stream,
        )  # fmt: skip
    assert torch.equal(o, o2)
    assert torch.equal(lse, _ops.smooth_k_lse(lse_raw, q, mean, 0.0))
    assert torch.equal(dq, grads[0]) and torch.equal(dv, grads[1])
    assert torch.equal(dk, (dk32 - dk32.mean(dim=1, keepdim=True)).bfloat16())


def test_smooth_k_cuda_forward_for_every_engine_recipe_and_refusals():
    cpu = mean_offset_qkv(SHAPES["gqa-d64"], seed=10)
    q, k, v, dout = (t.cuda().bfloat16() for t in cpu)
    for recipe in ("nvfp4-fast", "nvfp4-all", "fp4-direct"):  # the P paths other than exp2
        o = fp4attn.attn_func(q, k, v, recipe=recipe, causal=True, smooth_k=True)
        want = fp4attn.attn_func(*cpu[:3], recipe=recipe, causal=True, smooth_k=True)
        assert rel_l2(o.cpu(), want) <= 0.05, recipe  # P's codes: test_fwd_gpu.cu's looser bounds
    leaves = leaves_of(q, k, v)
    fp4attn.attn_func(*leaves, recipe="fp4-direct", smooth_k=True).backward(dout)  # now it has one
    assert all(bool(torch.isfinite(t.grad).all()) for t in leaves)
    with pytest.raises(fp4attn.UnsupportedError, match="^recipe: 'bf16'"):
        fp4attn.attn_func(q, k, v, recipe="bf16", smooth_k=True)
    with pytest.raises(fp4attn.UnsupportedError, match="^smooth_k: fp4attn::attn_fwd smooths K"):
        _ops.attn_fwd(q, k, v, "fp8", 0.0, False, "forward-o", True)


def test_smooth_k_cuda_bhsd_and_torch_compile():
    cpu = mean_offset_qkv(SHAPES["mha-d128"], seed=11)
    q, k, v, dout = (t.cuda().bfloat16() for t in cpu)
    with deterministic():
        want = func_grads(q, k, v, dout, recipe="fp8", causal=True, smooth_k=True)
        t = lambda x: x.transpose(1, 2)
        leaves = leaves_of(t(q), t(k), t(v))
        o = fp4attn.attn_func(*leaves, recipe="fp8", causal=True, smooth_k=True, layout="bhsd")
        o.backward(t(dout))
        assert torch.equal(t(o.detach()), want[0])
        for leaf, w in zip(leaves, want[2:]):
            assert torch.equal(t(leaf.grad), w)

        @torch.compile(backend="aot_eager", fullgraph=True)
        def step(q, k, v):
            return fp4attn.attn_func(q, k, v, recipe="fp8", causal=True, smooth_k=True)

        leaves = leaves_of(q, k, v)
        step(*leaves).backward(dout)
        for leaf, w in zip(leaves, want[2:]):
            assert torch.equal(leaf.grad, w)
