"""Limits at the package's border (issue 26, findings 8-10): Python floats checked in the float32
they become, the input range where each recipe is accurate (docs/numerics.md §9, measured here at
its edges on the golden model), and the border checks of varlen, hand-built QuantizedQKV and
decode."""

import dataclasses
import math
import re

import pytest
import torch

import fp4attn
from fp4attn import DecodePlan, PagedKVCache, UnsupportedError, append_kv, decode

FLT_MAX = float(torch.finfo(torch.float32).max)
FLT_TINY = float(torch.finfo(torch.float32).tiny)  # 2^-126, the smallest normal float32
NVFP4_SCALE_MIN = 2304 / FLT_MAX  # the smallest encode scale fp4attn computes (384 * 6 / FLT_MAX)


def gauss(shape, seed, amax=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if amax is not None:
        x = x / x.abs().max() * amax
    return x.float()


def small_qkv():
    return tuple(gauss((1, 32, 2, 64), seed) for seed in range(3))


# ---- finding 8: floats that cross into float32 ---------------------------------------------------

# (value, why it is refused): inf in float32, 0 in float32 (which past the border means
# "computed"), subnormal, and a normal float32 whose factor 8 / s_enc overflows (all-NaN output).
BAD_TENSOR_SCALES = [
    (1e300, "inf in float32"),
    (1e-300, "0 in float32"),
    (1e-45, "subnormal in float32"),
    (1e-38, "subnormal in float32"),
    (2e-38, ""),
    (-1.0, ""),
    (float("nan"), ""),
    (float("inf"), ""),
]


def _tensor_scale_calls():
    q, k, v = small_qkv()
    return {
        "q_tensor_scale": lambda s: fp4attn.quantize_qkv(q, k, v, q_tensor_scale=s),
        "k_tensor_scale": lambda s: fp4attn.quantize_qkv(q, k, v, k_tensor_scale=s),
        "v_tensor_scale": lambda s: fp4attn.quantize_qkv(
            q, k, v, recipe="nvfp4-all", v_tensor_scale=s
        ),
        "tensor_scale": lambda s: fp4attn.fake_quantize(q, tensor_scale=s),
        "quantize_q": lambda s: fp4attn.quantize_q(q, tensor_scale=s),
    }


@pytest.mark.parametrize("value,why", BAD_TENSOR_SCALES)
@pytest.mark.parametrize(
    "arg", ["q_tensor_scale", "k_tensor_scale", "v_tensor_scale", "tensor_scale", "quantize_q"]
)
def test_tensor_scales_outside_float32_are_refused_by_their_name(arg, value, why):
    name = "tensor_scale" if arg == "quantize_q" else arg
    with pytest.raises(ValueError) as e:
        _tensor_scale_calls()[arg](value)
    want = f"{name}: expected a finite value > 0, got {value!r}"
    want += f" ({why})" if why else ""
    assert (
        str(e.value) == want + "; as a float32 it must lie in [6.77e-36, 3.4e+38] (None = computed)"
    )


@pytest.mark.parametrize("value", [NVFP4_SCALE_MIN, 1e-30, 1.0, 1e30, FLT_MAX])
def test_tensor_scales_inside_the_range_give_finite_output(value):
    q, k, v = small_qkv()
    qkv = fp4attn.quantize_qkv(
        q, k, v, recipe="nvfp4-all", q_tensor_scale=value, k_tensor_scale=value,
        v_tensor_scale=value,
    )  # fmt: skip
    assert qkv.tensor_scales == (value, value, value)
    assert bool(torch.isfinite(fp4attn.attn_quantized(qkv)).all())
    assert bool(torch.isfinite(fp4attn.fake_quantize(q, tensor_scale=value)).all())


def test_hand_built_tensor_scales_are_checked_too():
    q, k, v = (t.requires_grad_(True) for t in small_qkv())
    qkv = fp4attn.quantize_qkv(q, k, v, recipe="nvfp4")
    for bad in ((1e300, 0.0, 0.0), (0.0, -2.0, 0.0), (0.0, 0.0, 1e-300)):
        i = next(j for j, s in enumerate(bad) if s != 0)
        with pytest.raises(
            ValueError,
            match="^"
            + re.escape(
                f"tensor_scales[{i}]: expected 0 (computed) or a finite value > 0, got {bad[i]!r}"
            ),
        ):
            fp4attn.attn_quantized(dataclasses.replace(qkv, tensor_scales=bad))
    with pytest.raises(TypeError, match=r"^tensor_scales: expected a tuple of 3 floats"):
        fp4attn.attn_quantized(dataclasses.replace(qkv, tensor_scales=(1.0, 2.0)))


@pytest.mark.parametrize(
    "value,why",
    [
        (1e300, "inf in float32"),
        (3e38, ""),
        (1e-300, "0 in float32"),
        (1e-45, "subnormal in float32"),
    ],
)
def test_softmax_scale_outside_float32_is_refused(value, why):
    """3e38 is a float32, but softmax_scale * log2(e), the kernels' float32 factor, is not; 1e-300
    is 0 in float32, which the CUDA entry points read as "the default 1/sqrt(d)"."""
    q, k, v = small_qkv()
    qkv = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    cache = PagedKVCache.empty(2, 16, 2, 64)
    tables, lens = torch.tensor([[0]], dtype=torch.int32), torch.tensor([4], dtype=torch.int32)
    calls = [
        lambda: fp4attn.attn_func(q, k, v, softmax_scale=value),
        lambda: fp4attn.attn_quantized(qkv, softmax_scale=value),
        lambda: fp4attn.attn_varlen_func(
            q[0],
            k[0],
            v[0],
            torch.tensor([0, 32], dtype=torch.int32),
            torch.tensor([0, 32], dtype=torch.int32),
            softmax_scale=value,
        ),
        lambda: decode(q[:, :1], cache, tables, lens, softmax_scale=value),
    ]
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        want = f"softmax_scale: expected a finite value > 0, got {value!r}"
        want += f" ({why})" if why else ""
        assert str(e.value) == (
            want + "; as a float32 it must lie in [1.18e-38, 2.36e+38] (None = 1/sqrt(head_dim))"
        )
    # The edges themselves are accepted.
    for ok in (FLT_TINY, FLT_MAX / math.log2(math.e) / 1.0001):
        assert fp4attn.attn_func(q, k, v, softmax_scale=ok).shape == q.shape


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("name", ["k_global", "v_global"])
def test_paged_cache_globals_are_checked_in_float32(fmt, name):
    hi = FLT_MAX if fmt == "nvfp4" else FLT_MAX / 448
    lo = NVFP4_SCALE_MIN if fmt == "nvfp4" else FLT_TINY
    for value in (1e300, 1e-300, 1e-45, -1.0, hi * 1.01):
        with pytest.raises(ValueError) as e:
            PagedKVCache.empty(2, 16, 2, 64, format=fmt, **{name: value})
        assert str(e.value).startswith(
            f"{name}: expected 0 (calibrate) or a finite value > 0, got {value!r}"
        )
        assert str(e.value).endswith(f"; as a float32 it must lie in [{lo:.3g}, {hi:.3g}]")
    for value in (0.0, lo, 1.0, hi):
        cache = PagedKVCache.empty(2, 16, 2, 64, format=fmt, **{name: value})
        assert getattr(cache, name).item() == pytest.approx(value, rel=1e-7)


# ---- finding 9: the input range where each recipe is accurate (docs/numerics.md §9) -------------

# docs/numerics.md §9: the smallest operand amax (a power of ten times 1, 2 or 5) at which O's
# rel-L2 stays within 10% of its value on amax-4 (N(0, 1)-like) inputs, for Q/K and for V, and the
# rel-L2 at a tenth of it (degraded). One operand is scaled at a time; a scaled Q or K comes with
# softmax_scale / c, so the scores, and the float64 reference, keep their distribution.
LOWER_LIMITS = {  # recipe: (Q/K limit, V limit)
    "bf16": (1e-37, 1e-37),
    "fp8": (2e-36, 5e-36),
    "fp8-fast": (2e-36, 5e-36),
    "int8": (2e-36, 5e-36),
    "int8-fast": (2e-36, 5e-36),
    "nvfp4": (1e-37, 5e-36),
    "nvfp4-hx": (1e-37, 5e-36),
    "mxfp4": (1e-37, 5e-36),
    "nvfp4-fast": (1e-37, 5e-36),
    "nvfp4-all": (1e-37, 1e-37),
    "fp4-direct": (1e-37, 1e-38),
}
UPPER_LIMITS = (1e37, 3e38)  # Q/K (softmax_scale / c stays a normal float32), V


def test_every_recipe_has_a_documented_range():
    assert set(LOWER_LIMITS) == set(fp4attn.RECIPES)


def _o_error(recipe, role, amax):
    base = [gauss((1, 128, 2, 64), seed, amax=4.0) for seed in (10, 11, 12)]
    i = "qkv".index(role)
    c = amax / 4
    base[i] = (base[i].double() * c).float()
    assert bool(torch.isfinite(base[i]).all()) and float(base[i].abs().max()) > 0
    scale = 0.125 if role == "v" else 0.125 / c
    q, k, v = base
    o = fp4attn.attn_func(q, k, v, softmax_scale=scale, recipe=recipe)
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    ref = (torch.softmax(scale * qd @ kd.transpose(-1, -2), -1) @ vd).transpose(1, 2)
    return float((o.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("role", ["q", "k", "v"])
@pytest.mark.parametrize("recipe", sorted(LOWER_LIMITS))
def test_recipes_are_accurate_inside_their_documented_range(recipe, role):
    nominal = _o_error(recipe, role, 4.0)
    lo = LOWER_LIMITS[recipe][role == "v"]
    for amax in (lo, UPPER_LIMITS[role == "v"]):
        err = _o_error(recipe, role, amax)
        assert err <= 1.1 * nominal + 1e-4, (amax, err, nominal)


@pytest.mark.parametrize("role", ["q", "k", "v"])
@pytest.mark.parametrize("recipe", sorted(LOWER_LIMITS))
def test_recipes_are_degraded_a_decade_below_their_range(recipe, role):
    """Below the limit the error is several times the nominal one, so the limit is a real edge
    and not a cautious guess (numerics.md §9 lists the values)."""
    nominal = _o_error(recipe, role, 4.0)
    lo = LOWER_LIMITS[recipe][role == "v"]
    err = _o_error(recipe, role, lo / 10)
    assert math.isfinite(err) and err > 1.5 * nominal, (err, nominal)


def test_nvfp4_hx_q_at_1e_40_is_the_documented_worst_case():
    # The repro: relative error of the Q operand of N(0, 1) * 1e-40 (subnormal inputs).
    x = (gauss((1, 128, 2, 64), 0).double() * 1e-40).float()
    fq = fp4attn.fake_quantize(x, recipe="nvfp4-hx", out_dtype=torch.float64)
    rel = float((fq - x.double()).norm() / x.double().norm())
    assert 10 < rel < 40  # numerics.md §9: about 21, i.e. no precision left
    ok = gauss((1, 128, 2, 64), 0, amax=1e-37)
    fq = fp4attn.fake_quantize(ok, recipe="nvfp4-hx", out_dtype=torch.float64)
    assert float((fq - ok.double()).norm() / ok.double().norm()) < 0.13


# ---- finding 10: border checks ------------------------------------------------------------------


def _packed(total, heads=2, d=64, seed=0):
    return gauss((total, heads, d), seed)


def test_varlen_offsets_on_another_device_are_refused_by_name():
    q, k, v = _packed(10), _packed(12, seed=1), _packed(12, seed=2)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: on meta, but q is on cpu$"):
        fp4attn.attn_varlen_func(q, k, v, cu_q.to("meta"), cu_k)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: on meta, but q is on cpu$"):
        fp4attn.attn_varlen_func(q, k, v, cu_q, cu_k.to("meta"))
    assert fp4attn.attn_varlen_func(q, k, v, cu_q, cu_k).shape == q.shape


def test_varlen_v_must_have_k_length():
    q, k = _packed(10), _packed(12, seed=1)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    for v in (_packed(13, seed=2), _packed(20, seed=2)):
        with pytest.raises(ValueError, match=r"^v: expected shape \(12, 2, 64\) like k, got"):
            fp4attn.attn_varlen_func(q, k, v, cu_q, cu_k)


@pytest.mark.parametrize("field", ["q_scale", "k_scale", "v_scale"])
@pytest.mark.parametrize("bad", [-1.0, float("inf"), -float("inf")])
def test_hand_built_operands_with_bad_scales_are_refused(field, bad):
    q, k, v = small_qkv()
    qkv = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    scale = getattr(qkv, field).clone()
    scale.view(-1)[1] = bad
    with pytest.raises(ValueError, match=rf"^{field}: expected values >= 0 \(or NaN"):
        fp4attn.attn_quantized(dataclasses.replace(qkv, **{field: scale}))


def test_nan_scales_from_quantize_qkv_still_propagate():
    # A NaN input gives NaN scales (numerics.md §2): the check lets them through to O.
    q, k, v = small_qkv()
    v = v.clone()
    v[0, 3, 1, 5] = float("nan")
    qkv = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    assert bool(torch.isnan(qkv.v_scale).any())
    o = fp4attn.attn_quantized(qkv)
    assert bool(torch.isnan(o[:, :, 1, 5]).all()) and bool(torch.isfinite(o[:, :, 0]).all())


def _cache_with_tokens():
    cache = PagedKVCache.empty(4, 16, 2, 64, format="nvfp4")
    kv = _packed(20, seed=3).bfloat16()
    append_kv(cache, kv, kv, torch.arange(20, dtype=torch.int32))
    tables = torch.tensor([[0, 1]], dtype=torch.int32)
    return cache, tables, torch.tensor([20], dtype=torch.int32)


def test_decode_refuses_q_that_requires_grad():
    cache, tables, lens = _cache_with_tokens()
    q = gauss((1, 1, 4, 64), 5).requires_grad_(True)
    plan = DecodePlan(cache, q, tables)  # a plan reads shapes only
    for call in (
        lambda: decode(q, cache, tables, lens),
        lambda: plan.run(q, cache, tables, lens),
    ):
        with pytest.raises(UnsupportedError, match=r"^q: requires grad, but decode has no"):
            call()
    want = decode(q.detach(), cache, tables, lens)
    with torch.no_grad():
        assert torch.equal(decode(q, cache, tables, lens), want)
        assert torch.equal(plan.run(q, cache, tables, lens), want)
    with torch.inference_mode():
        assert torch.equal(decode(q, cache, tables, lens), want)
