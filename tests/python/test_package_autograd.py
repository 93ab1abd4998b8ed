"""Autograd on the CPU path (the golden model's backward, docs/numerics.md §8) and the
straight-through fake quantization for QAT. Small shapes: the whole file runs in seconds."""

import math

import pytest
import torch

import fp4attn
from fp4attn import _C, _ops
from package_util import QUANTIZED_RECIPES, lse_ref, qkv

SMALL = {"s_q": 7, "s_k": 13, "h": 4, "h_kv": 2, "d": 64}
EXP2_RECIPES = ("bf16", "fp8", "nvfp4", "nvfp4-hx", "mxfp4", "nvfp4-all")


def ref_attention(q, k, v, causal, scale=None):
    """float64 softmax attention on BSHD inputs (GQA, bottom-right causal), differentiable."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s_q, s_k = q.shape[2], k.shape[2]
        i, j = torch.arange(s_q).unsqueeze(1), torch.arange(s_k).unsqueeze(0)
        s = s.masked_fill(j > i + s_k - s_q, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v).transpose(1, 2), p


def fq64(x, recipe, role):
    """The operand values of x in float64, as a new leaf."""
    return fp4attn.fake_quantize(x.detach(), recipe, role, out_dtype=torch.float64)


def attn_grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o, lse = fp4attn.attn_func(q, k, v, return_lse=True, **kw)
    o.backward(dout)
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def inputs(dtype=torch.float32, seed=0, **shape):
    q, k, v = qkv(dtype=dtype, seed=seed, **(SMALL | shape))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return q, k, v, dout


# ---- autograd is the golden backward ----------------------------------------------------------


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_source", ["forward-o", "high-precision-o"])
def test_autograd_equals_golden_backward(recipe, causal, d_source):
    q, k, v, dout = inputs()
    o, lse, dq, dk, dv = attn_grads(q, k, v, dout, recipe=recipe, causal=causal, d_source=d_source)
    want = [torch.empty_like(t) for t in (q, k, v)]
    _C.golden_backward(q, k, v, o, dout, lse, *want, recipe, 0.0, causal, d_source)
    for got, ref, name in zip((dq, dk, dv), want, "qkv"):
        assert got.dtype == torch.float32 and got.shape == ref.shape, name
        assert torch.equal(got, ref), f"d{name}"


def test_autograd_bhsd_bf16_and_scale():
    q, k, v, dout = inputs(dtype=torch.bfloat16)
    _, _, dq, dk, dv = attn_grads(q, k, v, dout, recipe="fp8", causal=True, softmax_scale=0.3)
    t = lambda x: x.transpose(1, 2)
    _, _, dq2, dk2, dv2 = attn_grads(
        t(q), t(k), t(v), t(dout), recipe="fp8", causal=True, softmax_scale=0.3, layout="bhsd"
    )
    want = [torch.empty(x.shape, dtype=torch.float32) for x in (q, k, v)]
    o, lse = fp4attn.attn_func(
        q, k, v, recipe="fp8", causal=True, softmax_scale=0.3, return_lse=True
    )
    _C.golden_backward(q, k, v, o, dout, lse, *want, "fp8", 0.3, True, "forward-o")
    for got, got_bhsd, ref in zip((dq, dk, dv), (dq2, dk2, dv2), want):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, ref.to(torch.bfloat16))
        assert torch.equal(t(got_bhsd), got)


def test_varlen_grads_are_each_sequence_alone():
    q, k, v, dout = (t[0] for t in inputs(s_q=12, s_k=20))  # packed [total, heads, d]
    cu_q, cu_k = torch.tensor([0, 5, 12], dtype=torch.int32), torch.tensor([0, 9, 20]).int()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = fp4attn.attn_varlen_func(*leaves, cu_q, cu_k, 7, 11, causal=True, recipe="nvfp4")
    o.backward(dout)
    for (q0, q1), (k0, k1) in zip(((0, 5), (5, 12)), ((0, 9), (9, 20))):
        want = attn_grads(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1],
            recipe="nvfp4", causal=True,
        )[2:]  # fmt: skip
        assert torch.equal(leaves[0].grad[q0:q1], want[0][0])
        assert torch.equal(leaves[1].grad[k0:k1], want[1][0])
        assert torch.equal(leaves[2].grad[k0:k1], want[2][0])


# ---- what the gradients are (numerics.md §8) --------------------------------------------------


def ref_grads(q, k, v, dout, recipe, causal):
    """float64 reference gradients at the fake-quantized operands Q^, K^, V^, and its P."""
    qh, kh, vh = (fq64(x, recipe, r).requires_grad_(True) for x, r in zip((q, k, v), "qkv"))
    o, p = ref_attention(qh, kh, vh, causal)
    o.backward(dout.double())
    return o.detach(), p.detach(), (qh, kh, vh), (qh.grad, kh.grad, vh.grad)


def assert_close_rel(got, ref, rel, what):
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    assert err <= rel, f"{what}: max error {err:.3g} of max |ref| > {rel}"


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("causal", [False, True])
def test_high_precision_o_is_the_gradient_at_the_fake_quantized_operands(recipe, causal):
    q, k, v, dout = inputs()
    _, _, *got = attn_grads(
        q, k, v, dout, recipe=recipe, causal=causal, d_source="high-precision-o"
    )
    _, _, _, want = ref_grads(q, k, v, dout, recipe, causal)
    # float32 gradients from a float32 LSE (p moves by about |LSE| 2^-24 relative).
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert_close_rel(g, w, 2e-6, name)
    # The same reference on the unquantized inputs is far off: the check sees the quantizers.
    qq, kk, vv = (x.double().requires_grad_(True) for x in (q, k, v))
    ref_attention(qq, kk, vv, causal)[0].backward(dout.double())
    assert float((got[0].double() - qq.grad).abs().max() / qq.grad.abs().max()) > 1e-3


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_o_moves_dq_dk_by_the_d_difference(recipe, causal):
    """Default D from the deployed O: dS moves by -p (D_fwd - D_hp), dV is unchanged."""
    q, k, v, dout = inputs()
    o, _, *fwd = attn_grads(q, k, v, dout, recipe=recipe, causal=causal)
    o_hp, p, (qh, kh, _), want = ref_grads(q, k, v, dout, recipe, causal)
    scale = 1 / math.sqrt(q.shape[-1])
    d_fwd = (dout.double() * o.double()).sum(-1).transpose(1, 2)  # [b, h, s_q]
    d_hp = (dout.double() * o_hp).sum(-1).transpose(1, 2)
    ds_shift = -p * (d_fwd - d_hp)[..., None]  # [b, h, s_q, s_k]
    group = q.shape[2] // k.shape[2]
    k_rep = kh.detach().transpose(1, 2).repeat_interleave(group, dim=1)
    dq_shift = (scale * ds_shift @ k_rep).transpose(1, 2)
    dk_shift = scale * ds_shift.transpose(-1, -2) @ qh.detach().transpose(1, 2)
    b, h_kv, s_k = k.shape[0], k.shape[2], k.shape[1]
    dk_shift = dk_shift.view(b, h_kv, group, s_k, -1).sum(2).transpose(1, 2)
    assert float(dq_shift.abs().max()) > 1e-3 * float(want[0].abs().max())  # not negligible
    assert_close_rel(fwd[0], want[0] + dq_shift, 2e-6, "dq")
    assert_close_rel(fwd[1], want[1] + dk_shift, 2e-6, "dk")
    assert_close_rel(fwd[2], want[2], 2e-6, "dv")


@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_against_finite_differences_of_float64_attention(recipe, causal):
    """torch.autograd.gradcheck: the values come from float64 attention at Q^ + (q - q0) (smooth;
    Q^ the fixed operand values at q0), the gradients from fp4attn's backward alone."""
    q0, k0, v0, _ = inputs(dtype=torch.float64, s_q=5, s_k=9, h=2, h_kv=1)
    base = [fq64(x, recipe, r) for x, r in zip((q0, k0, v0), "qkv")]
    if recipe == "bf16":  # BF16-exact inputs: the operands are the inputs themselves
        assert all(torch.equal(a, x) for a, x in zip(base, (q0, k0, v0)))

    def f(q, k, v):
        o = fp4attn.attn_func(q, k, v, recipe=recipe, causal=causal, d_source="high-precision-o")
        shifted = [b + (x - x0) for b, x, x0 in zip(base, (q, k, v), (q0, k0, v0))]
        return (o - o.detach()) + ref_attention(*shifted, causal)[0].detach()

    args = [x.clone().requires_grad_(True) for x in (q0, k0, v0)]
    assert torch.autograd.gradcheck(f, args, fast_mode=True, atol=1e-6, rtol=1e-4)


# ---- fake quantization ------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", EXP2_RECIPES)
def test_fake_quantized_q_k_give_the_golden_lse(recipe):
    """exp2 recipes: LSE = logsumexp of the scores of the operands the forward used, so the
    float64 LSE of fake_quantize(q), fake_quantize(k) matches it to FP32 rounding."""
    q, k, v = qkv(s_q=150, s_k=140, h=2, h_kv=1, d=64, seed=3)  # two 128-token scale tiles
    q = q * 3  # spread the scores, so one code off moves the LSE well above the tolerance
    _, lse = fp4attn.attn_func(q, k, v, recipe=recipe, causal=True, return_lse=True)
    scale = 1 / math.sqrt(64)

    def lse_of(qx, kx):
        s = (qx.transpose(1, 2) @ kx.transpose(1, 2).transpose(-1, -2)) * scale
        i, j = torch.arange(150).unsqueeze(1), torch.arange(140).unsqueeze(0)
        return torch.logsumexp(s.masked_fill(j > i - 10, float("-inf")), -1)  # bottom-right

    want = lse_of(fq64(q, recipe, "q"), fq64(k, recipe, "k").expand(-1, -1, 2, -1))
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(lse))
    err = float((lse.double() - want)[finite].abs().max())
    assert err < 4e-6, err
    unquantized = lse_of(q.double(), k.double().expand(-1, -1, 2, -1))
    if recipe != "bf16":  # bf16 of BF16-exact inputs is the identity
        assert float((lse.double() - unquantized)[finite].abs().max()) > 100 * 4e-6


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_fake_quantized_v_gives_the_golden_output(recipe):
    """q = 0: every score is 0, so causal row i of O is the mean of the V operand over keys 0..i
    times the P value of a zero score: this sees every value and the key order (40 keys: 3 groups
    of 16, padding included)."""
    _, k, v = qkv(s_q=40, h=2, h_kv=1, d=64, dtype=torch.float64, seed=4)
    q = torch.zeros(1, 40, 2, 64, dtype=torch.float64)
    o = fp4attn.attn_func(q, k, v, recipe=recipe, causal=True)
    vh = fq64(v, recipe, "v")
    p_max = 1.0  # every recipe's P of the row maximum is exact (e.g. 2^8 under the lift) ...
    if recipe == "nvfp4-all":  # ... but nvfp4-all's: 6 x 448 / 8 = 336 folds to E4M3 (RNE)
        p_max = float(torch.tensor(336.0).to(torch.float8_e4m3fn).double()) / 336
    want = p_max * vh.cumsum(1) / torch.arange(1, 41, dtype=torch.float64)[None, :, None, None]
    assert_close_rel(o, want.expand(-1, -1, 2, -1), 1e-12, "o")
    if recipe != "bf16":
        assert (
            float((o - v.cumsum(1) / torch.arange(1, 41)[None, :, None, None]).abs().max()) > 1e-3
        )


@pytest.mark.parametrize("recipe", QUANTIZED_RECIPES)
def test_fake_quantize_dequantizes_quantize_qkv(recipe):
    q, k, v = qkv(s_q=130, s_k=37, h=2, h_kv=1, d=128, seed=5)
    ops = fp4attn.quantize_qkv(q, k, v, recipe=recipe)
    for x, data, scale, role in (
        (q, ops.q_data, ops.q_scale, "q"),
        (k, ops.k_data, ops.k_scale, "k"),
    ):
        tile = torch.arange(x.shape[1]) // 128
        want = (data.double() * scale.double()[:, :, tile, None]).transpose(1, 2)
        assert torch.equal(fq64(x, recipe, role), want), role
    # V^T [b, h, d, pitch]: position p of group g holds key 16g + 2(p>>2) + (p&1) + 8((p>>1)&1).
    pos = torch.arange(ops.v_data.shape[3])
    key = (pos & ~15) + 2 * ((pos & 15) >> 2) + (pos & 1) + 8 * ((pos >> 1) & 1)
    want = torch.zeros(v.shape, dtype=torch.float64)
    real = key < v.shape[1]
    vals = ops.v_data.double() * ops.v_scale.double()[..., None]  # [b, h, d, pitch]
    want[:, key[real]] = vals[..., real].permute(0, 3, 1, 2)
    assert torch.equal(fq64(v, recipe, "v"), want)


def test_fake_quantize_straight_through_dtypes_and_layout():
    q, _, _ = qkv(s_q=20, h=2, d=64, dtype=torch.bfloat16, seed=6)
    x = q.clone().requires_grad_(True)
    y = fp4attn.fake_quantize(x, "nvfp4", "q")
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y, fq64(q, "nvfp4", "q").to(torch.bfloat16))  # one rounding of exact
    g = torch.randn(x.shape).to(torch.bfloat16)
    y.backward(g)
    assert torch.equal(x.grad, g)
    bhsd = fp4attn.fake_quantize(q.transpose(1, 2), "nvfp4", "q", layout="bhsd")
    assert torch.equal(bhsd.transpose(1, 2), y.detach())
    assert not torch.equal(y, q)  # it does quantize
    f64 = fp4attn.fake_quantize(q.double(), "fp8", "k")  # float64 in: read as float32 values
    assert f64.dtype == torch.float64 and torch.equal(f64, fq64(q.float(), "fp8", "k"))


def test_qat_step_through_fake_quantize_and_reference_attention():
    """A QAT-style graph: fake_quantize + float64 reference attention trains the same gradients
    as the golden backward with d_source="high-precision-o" (straight through the quantizer)."""
    q, k, v, dout = inputs(dtype=torch.float64, s_q=6, s_k=11)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    fq = [fp4attn.fake_quantize(x, "nvfp4", r) for x, r in zip(leaves, "qkv")]
    ref_attention(*fq, causal=True)[0].backward(dout)
    _, _, *got = attn_grads(q, k, v, dout, recipe="nvfp4", causal=True, d_source="high-precision-o")
    for g, leaf, name in zip(got, leaves, ("dq", "dk", "dv")):
        assert g.dtype == torch.float64
        assert_close_rel(g, leaf.grad, 2e-6, name)


# ---- errors -----------------------------------------------------------------------------------


def test_lse_gradient_raises_and_unused_lse_is_fine():
    q, k, v, dout = inputs()
    q.requires_grad_(True)
    o, lse = fp4attn.attn_func(q, k, v, recipe="fp8", return_lse=True)
    with pytest.raises(fp4attn.UnsupportedError, match="^lse: fp4attn's backward differentiates o"):
        (o * dout).sum().add(lse.sum()).backward(retain_graph=True)
    with pytest.raises(fp4attn.UnsupportedError, match="^lse:"):
        lse.sum().backward(retain_graph=True)
    q.grad = None
    (o * dout).sum().backward()  # lse returned but unused: its gradient is zero
    assert torch.equal(q.grad, attn_grads(q, k, v, dout, recipe="fp8")[2])


def test_bad_arguments_name_themselves():
    q, k, v, dout = inputs()
    with pytest.raises(ValueError, match="^d_source: expected one of"):
        fp4attn.attn_func(q, k, v, d_source="forward")
    with pytest.raises(ValueError, match="^role: expected one of"):
        fp4attn.fake_quantize(q, "fp8", "o")
    with pytest.raises(TypeError, match="^out_dtype:"):
        fp4attn.fake_quantize(q, "fp8", "q", out_dtype=torch.int32)
    o, lse = fp4attn.attn_func(q, k, v, return_lse=True)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    with pytest.raises(ValueError, match="^d_source: expected 'forward-o' or 'high-precision-o'"):
        _C.golden_backward(q, k, v, o, dout, lse, *grads, "fp8", 0.0, False, "x")
    with pytest.raises(ValueError, match="^dq"):
        _C.golden_backward(q, k, v, o, dout, lse, grads[1], grads[1], grads[2], "fp8", 0.0, False)
    with pytest.raises(ValueError, match="^dout"):
        _C.golden_backward(q, k, v, o, dout[:, :3], lse, *grads, "fp8", 0.0, False)


# ---- torch.library ----------------------------------------------------------------------------


def test_opcheck_attn_bwd():
    q, k, v, dout = inputs()
    o, lse = fp4attn.attn_func(q, k, v, recipe="nvfp4", causal=True, return_lse=True)
    for dlse in (None, torch.zeros_like(lse)):
        args = (dout, q, k, v, o, lse, dlse, "nvfp4", 0.0, True, "high-precision-o")
        torch.library.opcheck(_ops.attn_bwd, args)
    t = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)  # BSHD views of BHSD buffers
    args = (t(dout), t(q), t(k), t(v), t(o), lse, None, "fp8", 0.3, False, "forward-o")
    torch.library.opcheck(_ops.attn_bwd, args)


@pytest.mark.parametrize("d_source", ["forward-o", "high-precision-o"])
def test_opcheck_attn_fwd_with_grad_inputs(d_source):
    q, k, v, _ = inputs()
    args = (*(t.clone().requires_grad_(True) for t in (q, k, v)), "fp8", 0.0, True, d_source)
    # test_aot_dispatch_dynamic backpropagates random gradients into lse too, which raise by
    # design (test above); test_package_ops.py compiles a training step through aot_eager.
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(_ops.attn_fwd, args, test_utils=checks)
    with pytest.raises(Exception, match="lse: fp4attn's"):
        torch.library.opcheck(_ops.attn_fwd, args, test_utils="test_aot_dispatch_dynamic")


def test_opcheck_fake_quantize():
    q, _, _ = qkv(s_q=20, h=2, d=64, seed=7)
    for role in "qkv":
        x = q.clone().requires_grad_(True)
        torch.library.opcheck(_ops.fake_quantize, (x, "nvfp4", role, 0.0, torch.float32))


@pytest.mark.parametrize("recipe", ["int8", "int8-fast"])
def test_fake_quantize_of_smoothed_k_keeps_the_lse(recipe):
    # Keys with a large common offset: the forward multiplies K minus its mean and adds
    # scale * q . mean back to the LSE; fake-quantized K (the smoothed operand plus the mean)
    # must give that LSE, and without the mean it would miss by about scale * q . mean (~ 4 here).
    q, k, v = qkv(s_q=130, s_k=200, h=2, h_kv=1, d=64, seed=7)
    k = k + 3.0
    _, lse = fp4attn.attn_func(q, k, v, recipe=recipe, return_lse=True)
    fq, fk = fq64(q, recipe, "q"), fq64(k, recipe, "k")
    # The forward's correction uses the unquantized q (numerics.md §3), these values the
    # quantized one: (q - fq) . mean moves the LSE by up to ~0.08 here.
    assert (lse.double() - lse_ref(fq, fk)).abs().max() < 0.15
    smoothed_lse = lse_ref(fq, fk - k.double().mean(1, keepdim=True))
    assert (lse.double() - smoothed_lse).abs().max() > 1.0  # the test can tell the two apart
