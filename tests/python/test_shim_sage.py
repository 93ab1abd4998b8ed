"""fp4attn.sage: SageAttention's sageattn on fp4attn, on CPU (golden model): its signature,
layouts, K smoothing, LSE convention, causal alignment, head-dim padding and keyword arguments."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import fp4attn
from fp4attn import sage

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


def hnd(b=1, h=2, s_q=16, s_k=None, h_kv=None, d=64, k_mean=0.0, seed=0):
    """q [b, h, s_q, d], k and v [b, h_kv, s_k, d] ("HND"), BF16-exact float32; k_mean shifts
    K's channels (what K smoothing removes)."""
    g = torch.Generator().manual_seed(seed)
    s_k = s_q if s_k is None else s_k
    h_kv = h if h_kv is None else h_kv

    def make(heads, s, shift=0.0):
        return (torch.randn(b, heads, s, d, generator=g) + shift).to(torch.bfloat16).float()

    return make(h, s_q), make(h_kv, s_k, k_mean), make(h_kv, s_k)


def nhd(*tensors):
    return tuple(t.transpose(1, 2) for t in tensors)


def lse_ref(q, k, scale, mask=None):
    """float64 natural-log LSE [b, h, s_q] of scale * q.k, HND."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.logsumexp(s, dim=-1)


# ---- signature ---------------------------------------------------------------------------------

P = inspect.Parameter
# SageAttention's sageattention/core.py: sageattn(q, k, v, tensor_layout="HND", is_causal=False,
# sm_scale=None, return_lse=False, **kwargs)
SAGE_PARAMS = [
    ("q", P.POSITIONAL_OR_KEYWORD, P.empty),
    ("k", P.POSITIONAL_OR_KEYWORD, P.empty),
    ("v", P.POSITIONAL_OR_KEYWORD, P.empty),
    ("tensor_layout", P.POSITIONAL_OR_KEYWORD, "HND"),
    ("is_causal", P.POSITIONAL_OR_KEYWORD, False),
    ("sm_scale", P.POSITIONAL_OR_KEYWORD, None),
    ("return_lse", P.POSITIONAL_OR_KEYWORD, False),
]


def test_signature_is_sageattns_plus_recipe():
    got = [
        (p.name, p.kind, p.default) for p in inspect.signature(sage.sageattn).parameters.values()
    ]
    assert got == SAGE_PARAMS + [
        ("recipe", P.KEYWORD_ONLY, None),
        ("kwargs", P.VAR_KEYWORD, P.empty),
    ]


# ---- layouts, smoothing, LSE ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [{}, {"h": 4, "h_kv": 2, "s_k": 24}, {"d": 128, "h": 1}])
def test_layouts_equal_attn_func(shape):
    q, k, v = hnd(**shape)
    o_hnd = sage.sageattn(q, k, v)
    o_nhd = sage.sageattn(*nhd(q, k, v), tensor_layout="NHD")
    want = fp4attn.attn_func(q, k, v, layout="bhsd", smooth_k=True)  # SageAttention smooths K
    assert torch.equal(o_hnd, want)
    assert o_nhd.shape == nhd(q)[0].shape
    assert torch.equal(o_nhd, want.transpose(1, 2))


def test_positional_arguments():
    q, k, v = hnd(s_q=8, s_k=16)
    o, lse = sage.sageattn(*nhd(q, k, v), "NHD", True, 0.2, True)
    want, want_lse = sage.sageattn(
        *nhd(q, k, v), tensor_layout="NHD", is_causal=True, sm_scale=0.2, return_lse=True
    )
    assert torch.equal(o, want) and torch.equal(lse, want_lse)


def test_smooth_k_maps_to_fp4attns():
    q, k, v = hnd(k_mean=3.0)
    smooth = sage.sageattn(q, k, v)
    plain = sage.sageattn(q, k, v, smooth_k=False)
    assert torch.equal(plain, fp4attn.attn_func(q, k, v, layout="bhsd"))
    assert torch.equal(smooth, sage.sageattn(q, k, v, smooth_k=True))
    assert not torch.equal(plain, smooth)  # K's mean changes its quantization


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth_k", [True, False])
def test_lse_is_natural_log_with_the_smoothing_term(layout, smooth_k):
    q, k, v = hnd(h=4, h_kv=2, s_q=16, s_k=24, k_mean=2.0)
    args = (q, k, v) if layout == "HND" else nhd(q, k, v)
    o, lse = sage.sageattn(*args, tensor_layout=layout, return_lse=True, smooth_k=smooth_k)
    want_o, want = fp4attn.attn_func(
        q, k, v, return_lse=True, layout="bhsd", smooth_k=smooth_k, recipe="fp8"
    )
    assert torch.equal(o, want_o if layout == "HND" else want_o.transpose(1, 2))
    assert lse.shape == (1, 4, 16) and lse.dtype == torch.float32  # [b, h, s_q] in both
    assert torch.equal(lse, want)
    ref = lse_ref(q, k, 1 / 8)
    # Unsmoothed, K's mean costs fp8 accuracy (the reason SageAttention smooths K).
    assert (lse - ref).abs().max() < (0.1 if smooth_k else 0.25)
    assert (lse - ref / math.log(2)).abs().max() > 1  # not log2
    if smooth_k:  # without the term added back it would be the LSE of the smoothed scores
        mean = k.mean(dim=2, keepdim=True).repeat_interleave(2, dim=1)
        term = (q.double() @ mean.double().transpose(-1, -2)).squeeze(-1) / 8
        assert (lse - (ref - term)).abs().max() > 1


# ---- causal alignment ----------------------------------------------------------------------------


@pytest.mark.parametrize("s_q, s_k", [(16, 48), (48, 16), (24, 24)])
def test_causal_is_top_left(s_q, s_k):
    q, k, v = hnd(s_q=s_q, s_k=s_k)
    o, lse = sage.sageattn(q, k, v, is_causal=True, return_lse=True, recipe="bf16")
    top_left = torch.ones(s_q, s_k, dtype=torch.bool).tril()  # SageAttention: key j <= query i
    assert (o - TORCH_SDPA(q, k, v, attn_mask=top_left)).abs().max() < 0.03
    assert (lse - lse_ref(q, k, 1 / 8, top_left)).abs().max() < 0.03
    if s_q != s_k:
        bottom_right = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
        assert (o - TORCH_SDPA(q, k, v, attn_mask=bottom_right)).abs().max() > 0.5


def test_causal_nhd_equals_hnd():
    q, k, v = hnd(s_q=40, s_k=16, h=4, h_kv=1)
    o, lse = sage.sageattn(q, k, v, is_causal=True, return_lse=True)
    o_nhd, lse_nhd = sage.sageattn(*nhd(q, k, v), "NHD", is_causal=True, return_lse=True)
    assert torch.equal(o_nhd, o.transpose(1, 2)) and torch.equal(lse_nhd, lse)


# ---- head dims -------------------------------------------------------------------------------------


@pytest.mark.parametrize("d, padded", [(32, 64), (96, 128)])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_small_head_dims_are_zero_padded(d, padded, layout):
    q, k, v = hnd(d=d, s_q=8, s_k=16)
    args = (q, k, v) if layout == "HND" else nhd(q, k, v)
    o, lse = sage.sageattn(*args, tensor_layout=layout, return_lse=True)
    pad = [torch.nn.functional.pad(t, (0, padded - d)) for t in (q, k, v)]
    want, want_lse = fp4attn.attn_func(
        *pad, softmax_scale=1 / math.sqrt(d), return_lse=True, layout="bhsd", smooth_k=True
    )
    want = want[..., :d]
    assert torch.equal(o, want if layout == "HND" else want.transpose(1, 2))
    assert torch.equal(lse, want_lse)
    assert (lse - lse_ref(q, k, 1 / math.sqrt(d))).abs().max() < 0.1


def test_head_dim_errors():
    q, k, v = hnd(d=160, s_q=4)
    with pytest.raises(fp4attn.UnsupportedError, match="q: head_dim 160 is not supported"):
        sage.sageattn(q, k, v)
    q, k, v = hnd(d=64, s_q=4)
    with pytest.raises(ValueError, match="v: expected head_dim 64 like q, got 32"):
        sage.sageattn(q, k, v[..., :32])


# ---- arguments -----------------------------------------------------------------------------------

ACCEPTED = {
    "attn_mask": None,
    "qk_quant_gran": "per_thread",
    "pv_accum_dtype": "fp32+fp32",
    "smooth_v": False,
    "quantization_backend": "triton",
}


def test_accepted_kwargs_change_nothing():
    q, k, v = hnd()
    assert torch.equal(sage.sageattn(q, k, v, **ACCEPTED), sage.sageattn(q, k, v))


@pytest.mark.parametrize(
    "name, value",
    [
        ("attn_mask", torch.ones(16, 16, dtype=torch.bool)),
        ("qk_quant_gran", "per_warp"),
        ("pv_accum_dtype", "fp32+fp16"),
        ("smooth_v", True),
        ("smooth_v", 0),
        ("quantization_backend", "cuda"),
    ],
)
def test_other_kwarg_values_are_refused(name, value):
    q, k, v = hnd(s_q=4)
    with pytest.raises(fp4attn.UnsupportedError, match=f"^{name}: fp4attn's sageattn supports"):
        sage.sageattn(q, k, v, **{name: value})


def test_unknown_kwargs_are_refused():
    q, k, v = hnd(s_q=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dropout_p'"):
        sage.sageattn(q, k, v, dropout_p=0.0)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"tensor_layout": "BHSD"}, ValueError, "tensor_layout: expected 'HND' or 'NHD'"),
        ({"tensor_layout": None}, ValueError, "tensor_layout: expected 'HND' or 'NHD'"),
        ({"is_causal": 1}, TypeError, "is_causal: expected a bool"),
        ({"return_lse": None}, TypeError, "return_lse: expected a bool"),
        ({"sm_scale": "0.1"}, TypeError, "sm_scale: expected a float or None"),
        ({"sm_scale": -1.0}, ValueError, "sm_scale: expected a finite value > 0"),
        ({"smooth_k": 1}, TypeError, "smooth_k: expected a bool"),
        ({"recipe": "fp5"}, ValueError, "recipe: unknown recipe 'fp5'"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    q, k, v = hnd(s_q=4)
    with pytest.raises(error, match=message):
        sage.sageattn(q, k, v, **kwargs)


def test_bad_tensors():
    q, k, v = hnd(s_q=4)
    with pytest.raises(ValueError, match=r"q: expected rank 4 \(batch, seqlen, heads"):
        sage.sageattn(q[0], k, v, tensor_layout="NHD")
    with pytest.raises(TypeError, match="k: expected a torch.Tensor"):
        sage.sageattn(q, k.tolist(), v)
    with pytest.raises(ValueError, match="number of heads 3 is not a multiple of kv heads 2"):
        sage.sageattn(*hnd(h=3, h_kv=2, s_q=4))


# ---- the default recipe --------------------------------------------------------------------------


def test_recipe_default_follows_use_recipe():
    q, k, v = hnd()
    nvfp4 = fp4attn.attn_func(q, k, v, recipe="nvfp4", layout="bhsd", smooth_k=True)
    with fp4attn.use_recipe("nvfp4"):
        assert torch.equal(sage.sageattn(q, k, v), nvfp4)
    assert torch.equal(sage.sageattn(q, k, v, recipe="nvfp4"), nvfp4)
    assert not torch.equal(sage.sageattn(q, k, v), nvfp4)  # fp8, the default, again
