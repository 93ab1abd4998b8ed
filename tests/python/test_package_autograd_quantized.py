"""Autograd on the CPU path, second part: attn_quantized differentiable in the q, k, v its
operands came from (QuantizedQKV.sources), and attn_func's smooth_k (K smoothing) forward and
backward. Small shapes: the file runs in seconds."""

import dataclasses
import math

import pytest
import torch
from test_package_autograd import assert_close_rel, attn_grads, inputs, ref_attention

import fp4attn
from fp4attn import _C, _ops
from package_util import QUANTIZED_RECIPES, lse_ref, rel_l2, tolerance

ODD = {"s_q": 9, "s_k": 21, "h": 6, "h_kv": 2, "d": 64}  # odd lengths, GQA group 3


def quantized_grads(q, k, v, dout, recipe, scales=(None, None, None), layout="bshd", **kw):
    """o, lse and the leaves' gradients of attn_quantized(quantize_qkv(leaves))."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ops = fp4attn.quantize_qkv(
        *leaves,
        recipe=recipe,
        layout=layout,
        q_tensor_scale=scales[0],
        k_tensor_scale=scales[1],
        v_tensor_scale=scales[2],
    )
    assert ops.sources is not None and ops.sources[0] is leaves[0]
    o, lse = fp4attn.attn_quantized(ops, return_lse=True, **kw)
    o.backward(dout)
    return o.detach(), lse.detach(), *(t.grad for t in leaves)


# ---- attn_quantized's gradients are attn_func's ------------------------------------------------


@pytest.mark.parametrize("recipe", QUANTIZED_RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_source", ["forward-o", "high-precision-o"])
def test_attn_quantized_grads_equal_attn_func(recipe, causal, d_source):
    q, k, v, dout = inputs(**ODD)
    want = attn_grads(q, k, v, dout, recipe=recipe, causal=causal, d_source=d_source)
    got = quantized_grads(q, k, v, dout, recipe, causal=causal, d_source=d_source)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    assert float(got[3].abs().max()) > 0 and float(got[4].abs().max()) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attn_quantized_grads_bhsd_half_and_scale(dtype):
    q, k, v, dout = inputs(dtype=dtype, **ODD)
    kw = {"recipe": "nvfp4", "causal": True, "softmax_scale": 0.3}
    want = attn_grads(q, k, v, dout, **kw)
    t = lambda x: x.transpose(1, 2)  # BHSD views
    got = quantized_grads(t(q), t(k), t(v), t(dout), "nvfp4", layout="bhsd", causal=True,
                          softmax_scale=0.3)  # fmt: skip
    assert got[2].dtype == dtype
    assert torch.equal(t(got[0]), want[0]) and torch.equal(got[1], want[1])
    for a, b in zip(got[2:], want[2:]):
        assert torch.equal(t(a), b)


def test_replace_q_moves_the_q_source():
    q, k, v, dout = inputs(**ODD)
    q2 = inputs(seed=7, **ODD)[0]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ops = fp4attn.quantize_qkv(*leaves, recipe="fp8")
    q2_leaf = q2.clone().requires_grad_(True)
    ops2 = ops.replace_q(q2_leaf)
    assert ops2.sources[0] is q2_leaf and ops2.sources[1] is leaves[1]
    fp4attn.attn_quantized(ops2, causal=True).backward(dout)
    assert leaves[0].grad is None  # the replaced q is out of the graph
    want = attn_grads(q2, k, v, dout, recipe="fp8", causal=True)
    for got, ref in zip((q2_leaf.grad, leaves[1].grad, leaves[2].grad), want[2:]):
        assert torch.equal(got, ref)
    # replace_q's static scale is recorded for the backward.
    assert ops.replace_q(q2_leaf, tensor_scale=0.5).tensor_scales == (0.5, 0.0, 0.0)


def test_sources_only_when_a_gradient_can_be_asked_for():
    q, k, v, dout = inputs(**ODD)
    assert fp4attn.quantize_qkv(q, k, v).sources is None  # nothing requires grad
    leaf = q.clone().requires_grad_(True)
    with torch.no_grad():
        assert fp4attn.quantize_qkv(leaf, k, v).sources is None
    ops = fp4attn.quantize_qkv(leaf, k, v, recipe="fp8")
    assert ops.sources is not None and ops.differentiable
    with torch.no_grad():  # sources, but no graph: the plain operand forward
        o = fp4attn.attn_quantized(ops)
    assert not o.requires_grad
    assert torch.equal(o, fp4attn.attn_func(q, k, v, recipe="fp8"))
    # Only q requires grad: k and v get none, q the same as attn_func's.
    fp4attn.attn_quantized(ops).backward(dout)
    assert torch.equal(leaf.grad, attn_grads(q, k, v, dout, recipe="fp8")[2])


def test_to_moves_the_sources_with_the_operands():
    q, k, v, _ = inputs(**ODD)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ops = fp4attn.quantize_qkv(*leaves, recipe="fp8")
    moved = ops.to("meta")
    assert moved.q_data.device.type == "meta"
    assert all(t.device.type == "meta" for t in moved.sources)
    assert all(t.grad_fn is not None for t in moved.sources)  # still connected to the leaves
    assert fp4attn.quantize_qkv(q, k, v).to("meta").sources is None


# ---- static tensor scales ----------------------------------------------------------------------

STATIC = (0.5, 2.0, 0.25)  # q, k, v encode scales s_enc, far from the computed ones


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4-all"])
@pytest.mark.parametrize("causal", [False, True])
def test_static_tensor_scales_reach_the_backward(recipe, causal):
    """attn_func has no static scales: the reference is the golden backward called with them, and
    the gradients must differ from the computed scales' (the scales are not dropped)."""
    q, k, v, dout = inputs(**ODD)
    o, lse, *got = quantized_grads(q, k, v, dout, recipe, STATIC, causal=causal)
    want = [torch.empty_like(t) for t in (q, k, v)]
    _C.golden_backward(q, k, v, o, dout, lse, *want, recipe, 0.0, causal, "forward-o", *STATIC)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name
    computed = attn_grads(q, k, v, dout, recipe=recipe, causal=causal)
    assert not torch.equal(o, computed[0])
    moved = [rel_l2(a, b) for a, b in zip(got, computed[2:])]
    assert min(moved[:2]) > 1e-3, moved  # dq, dk (nvfp4's V has no tensor scale)
    if recipe == "nvfp4-all":
        assert moved[2] > 1e-3, moved


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4-all"])
def test_static_scales_high_precision_o_is_the_gradient_at_their_operands(recipe):
    """With static scales, high-precision-o gradients are float64 attention's at the operands
    fake_quantize gives with the same scales (and not at the computed scales' operands)."""
    q, k, v, dout = inputs(**ODD)
    _, _, *got = quantized_grads(
        q, k, v, dout, recipe, STATIC, causal=True, d_source="high-precision-o"
    )

    def ref(scales):
        xs = [
            fp4attn.fake_quantize(
                x, recipe, r, tensor_scale=s, out_dtype=torch.float64
            ).requires_grad_(True)
            for x, r, s in zip((q, k, v), "qkv", scales)
        ]
        ref_attention(*xs, causal=True)[0].backward(dout.double())
        return [x.grad for x in xs]

    for g, w, name in zip(got, ref(STATIC), ("dq", "dk", "dv")):
        assert_close_rel(g, w, 2e-6, name)
    far = ref((None, None, None))
    assert rel_l2(got[0], far[0]) > 1e-3


# ---- errors ------------------------------------------------------------------------------------


def test_operands_without_sources_say_how_to_get_gradients():
    q, k, v, dout = inputs()
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")  # no grad asked: no sources
    leaf = q.clone().requires_grad_(True)
    o = fp4attn.attn_quantized(ops.replace_q(leaf))  # q_data carries leaf's graph, k/v do not
    with pytest.raises(NotImplementedError, match=r"fp4attn.quantize_qkv\(q, k, v, ...\) on q, k"):
        o.backward(dout)
    v_scale = ops.v_scale.clone().requires_grad_(True)  # operands edited by hand
    o = fp4attn.attn_quantized(dataclasses.replace(ops, v_scale=v_scale))
    with pytest.raises(NotImplementedError, match="no gradient for operands without their sources"):
        o.sum().backward()


def test_lse_gradient_raises_through_attn_quantized():
    q, k, v, dout = inputs()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, lse = fp4attn.attn_quantized(fp4attn.quantize_qkv(*leaves, recipe="fp8"), return_lse=True)
    with pytest.raises(fp4attn.UnsupportedError, match="^lse: fp4attn's backward differentiates o"):
        (o * dout).sum().add(lse.sum()).backward(retain_graph=True)
    (o * dout).sum().backward()  # lse returned but unused: fine
    assert torch.equal(leaves[0].grad, attn_grads(q, k, v, dout, recipe="fp8")[2])


def test_bad_sources_and_d_source_name_themselves():
    q, k, v, _ = inputs(**ODD)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ops = fp4attn.quantize_qkv(*leaves, recipe="fp8")
    with pytest.raises(ValueError, match="^d_source: expected one of"):
        fp4attn.attn_quantized(ops, d_source="forward")
    bad = dataclasses.replace(ops, sources=(leaves[0][:, :3], leaves[1], leaves[2]))
    with pytest.raises(ValueError, match=r"^sources: q/k shapes \(1, 3, 6, 64\)"):
        fp4attn.attn_quantized(bad)
    bad = dataclasses.replace(ops, sources=(leaves[0].double(), leaves[1], leaves[2]))
    with pytest.raises(TypeError, match="^k: dtype torch.float32 differs from q's"):
        fp4attn.attn_quantized(bad)
    bad = dataclasses.replace(ops, sources=tuple(t.double() for t in leaves))
    with pytest.raises(TypeError, match="^sources: dtype torch.float64 differs from out_dtype"):
        fp4attn.attn_quantized(bad)
    with pytest.raises(TypeError, match="^sources: expected a tuple"):
        fp4attn.attn_quantized(dataclasses.replace(ops, sources=leaves[0]))
    o, lse = fp4attn.attn_func(q, k, v, recipe="nvfp4", return_lse=True)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    with pytest.raises(ValueError, match="^k_tensor_scale: expected a finite value >= 0"):
        _C.golden_backward(q, k, v, o, q, lse, *grads, "nvfp4", 0.0, False, "forward-o", 0, -1.0)


def test_opcheck_attn_quantized_ops():
    q, k, v, dout = inputs(**ODD)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ops = fp4attn.quantize_qkv(*leaves, recipe="nvfp4", k_tensor_scale=2.0)
    operands = [getattr(ops, n).detach() for n in fp4attn.QuantizedQKV.TENSORS]
    args = (*leaves, *operands, "nvfp4", 0.0, True, torch.float32, "high-precision-o",
            0.0, 2.0, 0.0, False)  # fmt: skip
    # FP8 inputs: no test_schema on CPU (see test_package_ops.py); test_aot_dispatch_dynamic
    # backpropagates random gradients into lse, which raise by design.
    checks = ("test_autograd_registration", "test_faketensor")
    torch.library.opcheck(_ops.attn_quantized_fwd, args, test_utils=checks)
    o, lse = fp4attn.attn_quantized(ops, causal=True, return_lse=True, d_source="high-precision-o")
    bwd = (dout, o.detach(), lse.detach(), None, None, q, k, v, *(None,) * 6, "nvfp4", 0.0, True,
           "high-precision-o", 0.0, 2.0, 0.0, False)  # fmt: skip
    torch.library.opcheck(_ops.attn_quantized_bwd, bwd)


# ---- smooth_k ----------------------------------------------------------------------------------


def outlier_qkv(b=1, s_q=48, s_k=80, h=4, h_kv=2, d=64, seed=0, q_outliers=10.0):
    """The suite's outlier-channels input, roughly (src/harness/suite.cc): four K channels with
    a mean of +-20 and a spread of 0.5, the others a per-head mean of 0.5 N(0, 1) plus N(0, 1);
    q N(0, 1) with the outlier channels x q_outliers. BF16-exact float32."""
    g = torch.Generator().manual_seed(seed)
    chans = [(2 * i + 1) * d // 8 for i in range(4)]
    k = torch.randn(b, s_k, h_kv, d, generator=g) + 0.5 * torch.randn(1, 1, h_kv, d, generator=g)
    for i, c in enumerate(chans):
        k[..., c] = (-20.0 if i % 2 else 20.0) + 0.5 * torch.randn(b, s_k, h_kv, generator=g)
    q = torch.randn(b, s_q, h, d, generator=g)
    q[..., chans] *= q_outliers
    v = torch.randn(b, s_k, h_kv, d, generator=g)
    dout = torch.randn(b, s_q, h, d, generator=g)
    return [t.bfloat16().float() for t in (q, k, v, dout)]


def exact_grads(q, k, v, dout, causal):
    """o and gradients of float64 softmax attention of the unquantized inputs."""
    xs = [t.double().requires_grad_(True) for t in (q, k, v)]
    o, _ = ref_attention(*xs, causal)
    o.backward(dout.double())
    return o.detach(), *(x.grad for x in xs)


def smoothed_k_operand(k, recipe):
    """The smoothed K operand's float64 values (BSHD) and the mean (float64 [b, h_kv, d])."""
    data, scale, mean = _ops.quantize_k_smoothed(k, recipe, 0.0)
    return _ops.dequantize_operand(data, scale, "k", k.shape[1]), mean.double()


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "mxfp4", "bf16"])
def test_smoothed_k_is_k_minus_its_bf16_mean(recipe):
    _, k, _, _ = outlier_qkv()
    data, scale, mean = _ops.quantize_k_smoothed(k, recipe, 0.0)
    want_mean = k.double().mean(1).to(torch.bfloat16)  # [b, h_kv, d]
    assert torch.equal(mean, want_mean.float())
    smoothed = (k.double() - want_mean.double()[:, None]).float()
    ref_data, ref_scale = _ops.quantize_operand(smoothed, recipe, "k", 0.0)
    assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
    assert torch.equal(scale, ref_scale)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "nvfp4-hx", "mxfp4", "nvfp4-all", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_smooth_k_lse_is_the_smoothed_operands_plus_q_dot_mean(recipe, causal):
    """exp2 recipes: lse = logsumexp(scale Q^ K'^T) + scale q . mean, K' the smoothed operand."""
    q, k, v, _ = outlier_qkv(q_outliers=1.0)
    _, lse = fp4attn.attn_func(
        q, k, v, recipe=recipe, causal=causal, smooth_k=True, return_lse=True
    )
    kh, mean = smoothed_k_operand(k, recipe)
    qh = fp4attn.fake_quantize(q, recipe, "q", out_dtype=torch.float64)
    group = q.shape[2] // k.shape[2]
    qm = torch.einsum("bshd,bhd->bhs", q.double(), mean.repeat_interleave(group, dim=1))
    want = lse_ref(qh, kh, causal) + qm / math.sqrt(q.shape[3])
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(lse))
    err = (lse.double() - want)[finite].abs() / want[finite].abs().clamp(min=1)
    assert float(err.max()) < 4e-6, float(err.max())


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "mxfp4", "nvfp4-hx"])
def test_smooth_k_is_closer_to_float64_on_outlier_keys(recipe):
    """The outlier input: a large channel mean on K. Smoothing removes it before quantizing, so o,
    lse and every gradient get markedly closer to float64 attention of the inputs."""
    q, k, v, dout = outlier_qkv()
    o_ref, *g_ref = exact_grads(q, k, v, dout, causal=True)
    lse_want = lse_ref(q, k, causal=True)
    errors = {}
    for smooth in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        o, lse = fp4attn.attn_func(
            *leaves, recipe=recipe, causal=True, smooth_k=smooth, return_lse=True
        )
        o.backward(dout)
        errors[smooth] = [rel_l2(o.detach(), o_ref)]
        errors[smooth] += [rel_l2(t.grad, g) for t, g in zip(leaves, g_ref)]
        errors[smooth].append(float((lse.detach().double() - lse_want).abs().max()))
    plain, smooth = errors[False], errors[True]
    for name, a, b in zip(("o", "dq", "dk", "dv", "lse"), smooth, plain):
        assert a < 0.5 * b, f"{name}: smooth_k {a:.4g}, plain {b:.4g}"
    if recipe == "nvfp4":  # measured: o rel-L2 0.97 -> 0.26, lse max error 8.4 -> 0.56
        assert smooth[0] < 0.3 and plain[0] > 3 * smooth[0]
        assert plain[4] > 10 * smooth[4]


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_smooth_k_on_gaussian_inputs_is_within_the_recipe_tolerance(recipe, causal):
    q, k, v, dout = inputs(s_q=40, s_k=70, h=4, h_kv=2, d=64)
    o_ref, *g_ref = exact_grads(q, k, v, dout, causal)
    o, lse, *grads = attn_grads(q, k, v, dout, recipe=recipe, causal=causal, smooth_k=True)
    assert rel_l2(o, o_ref) <= tolerance(recipe)
    assert float((lse.double() - lse_ref(q, k, causal)).abs().max()) < 20 * tolerance(recipe)
    for g, w in zip(grads, g_ref):
        assert rel_l2(g, w) <= 2 * tolerance(recipe)


def smoothed_reference(q, k, v, dout, recipe, causal):
    """float64 gradients of attention at the operands smooth_k uses, K entering as k - mean(k)
    straight through the quantizer and the mean's BF16 rounding: the golden backward's model."""
    kh, _ = smoothed_k_operand(k, recipe)
    qh = fp4attn.fake_quantize(q, recipe, "q", out_dtype=torch.float64)
    vh = fp4attn.fake_quantize(v, recipe, "v", out_dtype=torch.float64)
    xs = [t.double().requires_grad_(True) for t in (q, k, v)]
    smooth = xs[1] - xs[1].mean(1, keepdim=True)
    k_op = smooth + (kh - smooth).detach()  # value K'^, gradient through k - mean(k)
    q_op = xs[0] + (qh - xs[0]).detach()
    v_op = xs[2] + (vh - xs[2]).detach()
    ref_attention(q_op, k_op, v_op, causal)[0].backward(dout.double())
    return [x.grad for x in xs]


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("causal", [False, True])
def test_smooth_k_high_precision_o_is_the_gradient_of_the_smoothed_graph(recipe, causal):
    q, k, v, dout = outlier_qkv(q_outliers=1.0)
    _, _, *got = attn_grads(
        q, k, v, dout, recipe=recipe, causal=causal, smooth_k=True, d_source="high-precision-o"
    )
    want = smoothed_reference(q, k, v, dout, recipe, causal)
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert_close_rel(g, w, 2e-6, name)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_smooth_k_dk_sums_to_zero_over_the_keys(recipe):
    """dK of k - mean(k): its sum over the keys vanishes per (batch, kv head, channel), also with
    forward-o's D (whose rows of dS do not sum to zero: without smoothing the sum does not)."""
    q, k, v, dout = outlier_qkv(q_outliers=1.0)
    sums = {}
    for smooth in (False, True):
        _, _, _, dk, _ = attn_grads(q, k, v, dout, recipe=recipe, causal=True, smooth_k=smooth)
        sums[smooth] = float(dk.double().sum(1).abs().max() / dk.double().abs().max())
    assert sums[True] < 1e-5 and sums[False] > 1e-3, sums


def test_smooth_k_is_the_golden_model_bit_for_bit():
    q, k, v, dout = outlier_qkv(s_q=21, s_k=35, h=6, h_kv=2)
    o, lse, *grads = attn_grads(q, k, v, dout, recipe="nvfp4", causal=True, smooth_k=True)
    o2, lse2 = torch.empty_like(o), torch.empty_like(lse)
    _C.golden_forward(q, k, v, o2, lse2, "nvfp4", 0.0, True, True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    want = [torch.empty_like(t) for t in (q, k, v)]
    _C.golden_backward(q, k, v, o, dout, lse, *want, "nvfp4", 0.0, True, smooth_k=True)
    for g, w in zip(grads, want):
        assert torch.equal(g, w)
    plain = attn_grads(q, k, v, dout, recipe="nvfp4", causal=True)
    assert not torch.equal(plain[0], o)


def test_smooth_k_bad_argument_and_cuda_only_op_paths():
    q, k, v, _ = inputs()
    with pytest.raises(TypeError, match="^smooth_k: expected a bool"):
        fp4attn.attn_func(q, k, v, smooth_k=1)
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    args = (q, k, v, *(getattr(ops, n) for n in fp4attn.QuantizedQKV.TENSORS), "fp8", 0.0,
            False, torch.float32, "forward-o", 0.0, 0.0, 0.0, True)  # fmt: skip
    with pytest.raises(fp4attn.UnsupportedError, match="^smooth_k: the operand path"):
        _ops.attn_quantized_fwd(*args)


def test_smooth_k_lse_helper_matches_the_golden_term():
    """_ops.smooth_k_lse (the CUDA path's LSE term) applied to the smoothed operands' LSE gives
    the golden model's smooth_k LSE (to one float32 rounding)."""
    q, k, v, _ = outlier_qkv(s_q=21, s_k=35, h=6, h_kv=2)
    _, lse = fp4attn.attn_func(q, k, v, recipe="fp8", causal=True, smooth_k=True, return_lse=True)
    q_data, q_scale = _ops.quantize_operand(q, "fp8", "q", 0.0)
    k_data, k_scale, mean = _ops.quantize_k_smoothed(k, "fp8", 0.0)
    v_data, v_scale = _ops.quantize_operand(v, "fp8", "v", 0.0)
    _, lse_raw = _ops.attn_operands_fwd(
        q_data, q_scale, k_data, k_scale, v_data, v_scale, "fp8", 0.0, True, torch.float32
    )
    got = _ops.smooth_k_lse(lse_raw, q, mean, 0.0)
    finite = torch.isfinite(lse)
    assert torch.equal(finite, torch.isfinite(got))
    ulp = lse[finite].abs().clamp(min=1) * 2**-23
    assert bool(((got - lse)[finite].abs() <= 2 * ulp).all())


def test_attn_quantized_backward_under_torch_compile():
    q, k, v, _ = inputs(**ODD)
    grads = []
    for compiled in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

        def block(q, k, v):
            ops = fp4attn.quantize_qkv(q * 1.0, k, v, recipe="nvfp4", k_tensor_scale=2.0)
            return fp4attn.attn_quantized(ops, causal=True).square().sum()

        fn = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for eager, compiled in zip(*grads):
        assert bool(eager.abs().sum() > 0)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
