"""fp4attn.sdpa: the torch.nn.functional.scaled_dot_product_attention shim on CPU (golden model):
its signature, its results against attn_func, each fallback against torch's own function, the
causal alignment, patching, the default recipe, autograd and torch.compile."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import fp4attn
from fp4attn import _layout, sdpa

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention  # torch's own, whatever F holds


@pytest.fixture(autouse=True)
def _fresh():
    sdpa.reset_counts()
    before = F.scaled_dot_product_attention
    yield
    F.scaled_dot_product_attention = before  # a failed test leaves no patch behind


def bhsd(b=1, h=2, s_q=16, s_k=None, h_kv=None, d=64, dtype=torch.float32, seed=0):
    """q [b, h, s_q, d], k and v [b, h_kv, s_k, d], BF16-exact values."""
    g = torch.Generator().manual_seed(seed)
    s_k = s_q if s_k is None else s_k
    h_kv = h if h_kv is None else h_kv

    def make(heads, s):
        return torch.randn(b, heads, s, d, generator=g).to(torch.bfloat16).to(dtype)

    return make(h, s_q), make(h_kv, s_k), make(h_kv, s_k)


def counted(**expected) -> dict[str, int]:
    """fallback_counts() as it should read: the given counts, 0 elsewhere."""
    return {"calls": 0, **dict.fromkeys(sdpa.REASONS, 0), **expected}


# ---- signature ---------------------------------------------------------------------------------

P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
# torch's schema: aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value,
# Tensor? attn_mask=None, float dropout_p=0., bool is_causal=False, *, float? scale=None,
# bool enable_gqa=False)
TORCH_PARAMS = [
    ("query", P, inspect.Parameter.empty),
    ("key", P, inspect.Parameter.empty),
    ("value", P, inspect.Parameter.empty),
    ("attn_mask", P, None),
    ("dropout_p", P, 0.0),
    ("is_causal", P, False),
    ("scale", K, None),
    ("enable_gqa", K, False),
]


def params(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signature_is_torchs_plus_recipe():
    assert params(sdpa.scaled_dot_product_attention) == TORCH_PARAMS + [("recipe", K, None)]
    assert params(sdpa.fallback_reason) == TORCH_PARAMS + [("recipe", K, None)]


def test_signature_literal_matches_torchs_schema():
    schema = torch.ops.aten.scaled_dot_product_attention.default._schema
    got = [(a.name, K if a.kwarg_only else P) for a in schema.arguments]
    assert got == [(name, kind) for name, kind, _ in TORCH_PARAMS]
    defaults = [a.default_value for a in schema.arguments if a.has_default_value()]
    assert defaults == [default for _, _, default in TORCH_PARAMS[3:]]


def test_fallback_is_torchs_function():
    assert sdpa._TORCH_SDPA is TORCH_SDPA


# ---- runs fp4attn ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ({}, {}),
        ({}, {"is_causal": True}),
        ({"h": 4, "h_kv": 2}, {"enable_gqa": True}),
        ({"h": 4, "h_kv": 4}, {"enable_gqa": True}),  # enable_gqa with equal heads
        ({"s_q": 8, "s_k": 24}, {"scale": 0.3}),
        ({"d": 128, "h": 1}, {}),
        ({"dtype": torch.bfloat16}, {"is_causal": True}),
        ({"dtype": torch.float64}, {}),
    ],
)
def test_equals_attn_func(shape, kwargs):
    q, k, v = bhsd(**shape)
    o = sdpa.scaled_dot_product_attention(q, k, v, **kwargs)
    want = fp4attn.attn_func(
        q, k, v, softmax_scale=kwargs.get("scale"), causal=kwargs.get("is_causal", False),
        layout="bhsd",
    )  # fmt: skip
    assert torch.equal(o, want)
    assert o.shape == TORCH_SDPA(q, k, v, enable_gqa=True).shape and o.dtype == q.dtype
    assert sdpa.fallback_counts() == counted(calls=1)


def test_close_to_torch():
    # The bf16 recipe's error is small: this checks the semantics (scale, GQA head mapping).
    q, k, v = bhsd(h=4, h_kv=2, s_q=24, s_k=40)
    o = sdpa.scaled_dot_product_attention(q, k, v, scale=0.2, enable_gqa=True, recipe="bf16")
    want = TORCH_SDPA(q, k, v, scale=0.2, enable_gqa=True)
    assert (o - want).abs().max() < 0.03


@pytest.mark.parametrize("shape", [(16, 64), (2, 16, 64), (2, 3, 2, 16, 64)])
def test_other_ranks(shape):
    # [s, d], [h, s, d], [b, c, h, s, d]: dims before the heads' are batch dims, as in torch.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(torch.bfloat16).float() for _ in range(3))
    o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    heads = shape[-3] if len(shape) >= 3 else 1
    q4, k4, v4 = (t.reshape(-1, heads, *shape[-2:]) for t in (q, k, v))
    want = fp4attn.attn_func(q4, k4, v4, causal=True, layout="bhsd")
    assert o.shape == shape
    assert torch.equal(o, want.reshape(shape))
    assert sdpa.fallback_counts() == counted(calls=1)


def test_strided_inputs():
    # A head_dim that is not contiguous is copied (fp4attn needs stride 1 there), other strides
    # are read as they are; the output is a view of a BSHD buffer, as attn_func's.
    q, k, v = bhsd()
    k_t = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    q_bshd = q.transpose(1, 2).contiguous().transpose(1, 2)
    o = sdpa.scaled_dot_product_attention(q_bshd, k_t, v)
    assert k_t.stride(-1) != 1
    assert torch.equal(o, fp4attn.attn_func(q, k, v, layout="bhsd"))
    assert not o.is_contiguous() and o.transpose(1, 2).is_contiguous()


# ---- causal alignment ----------------------------------------------------------------------------


def bottom_right(q, k, v):
    """torch SDPA with FlashAttention's (bottom-right) causal mask."""
    s_q, s_k = q.shape[-2], k.shape[-2]
    mask = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
    return TORCH_SDPA(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("s_q, s_k", [(16, 48), (48, 16)])
def test_causal_is_top_left(s_q, s_k):
    q, k, v = bhsd(s_q=s_q, s_k=s_k)
    o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, recipe="bf16")
    top_left = TORCH_SDPA(q, k, v, is_causal=True)
    assert (o - top_left).abs().max() < 0.03
    assert (o - bottom_right(q, k, v)).abs().max() > 0.5  # the alignments do differ here
    assert sdpa.fallback_counts() == counted(calls=1)


def test_causal_shorter_q_runs_on_the_first_keys():
    q, k, v = bhsd(s_q=16, s_k=48)
    o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = fp4attn.attn_func(q, k[:, :, :16], v[:, :, :16], causal=True, layout="bhsd")
    assert torch.equal(o, want)


def test_causal_longer_q_is_a_square_then_full():
    q, k, v = bhsd(s_q=48, s_k=16)
    o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    head = fp4attn.attn_func(q[:, :, :16], k, v, causal=True, layout="bhsd")
    tail = fp4attn.attn_func(q[:, :, 16:], k, v, causal=False, layout="bhsd")
    assert torch.equal(o, torch.cat((head, tail), 2))


def test_attn_top_left_lse():
    q, k, v = bhsd(s_q=24, s_k=8)
    o, lse = sdpa.attn_top_left(q, k, v, causal=True, return_lse=True, layout="bhsd")
    _, lse_head = fp4attn.attn_func(q[:, :, :8], k, v, causal=True, return_lse=True, layout="bhsd")
    _, lse_tail = fp4attn.attn_func(q[:, :, 8:], k, v, return_lse=True, layout="bhsd")
    assert torch.equal(lse, torch.cat((lse_head, lse_tail), 2))
    assert lse.shape == (1, 2, 24) and o.shape == q.shape


# ---- fallbacks ---------------------------------------------------------------------------------


class _Sub(torch.Tensor):
    pass


def _nested():
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(2, s, 64, generator=g) for s in (5, 7)]
    t = torch.nested.nested_tensor(rows, layout=torch.jagged)  # [b, j, h, d] after transpose
    return t, t, t


def _bool_mask():
    q, k, v = bhsd()
    return (q, k, v, torch.ones(16, 16, dtype=torch.bool)), {}


def _float_mask():
    q, k, v = bhsd()
    return (q, k, v, torch.zeros(16, 16)), {}


# reason -> a builder of (args, kwargs); torch's function either runs them or raises.
FALLBACKS = [
    ("argument", lambda: ((bhsd()[0].tolist(), *bhsd()[1:]), {})),
    ("argument", lambda: (bhsd(), {"is_causal": 1})),
    ("nested", lambda: (_nested(), {})),
    ("subclass", lambda: (tuple(t.as_subclass(_Sub) for t in bhsd()), {})),
    ("attn_mask", _bool_mask),
    ("attn_mask", _float_mask),
    ("dropout", lambda: ((*bhsd(), None, 0.5), {})),
    ("rank", lambda: ((bhsd()[0][0, 0, 0],) * 3, {})),
    ("rank", lambda: ((bhsd()[0], bhsd()[1][0], bhsd()[2][0]), {})),
    ("shape", lambda: ((bhsd(b=2)[0], *bhsd(b=1)[1:]), {})),  # torch broadcasts the batch
    ("shape", lambda: ((*bhsd()[:2], bhsd(s_q=8)[2]), {})),
    ("empty", lambda: (bhsd(s_q=0), {})),
    ("empty", lambda: ((bhsd()[0], *bhsd(s_q=0)[1:]), {})),
    ("empty", lambda: (bhsd(b=0), {})),
    ("head_dim_mismatch", lambda: ((*bhsd()[:2], bhsd(d=32)[2]), {})),
    ("head_dim", lambda: (bhsd(d=32), {})),
    ("head_dim", lambda: (bhsd(d=96), {"is_causal": True})),
    ("gqa", lambda: (bhsd(h=4, h_kv=2), {})),  # torch raises without enable_gqa
    ("gqa", lambda: (bhsd(h=3, h_kv=2), {"enable_gqa": True})),
    ("gqa", lambda: (bhsd(h=4, h_kv=1), {})),  # torch broadcasts one kv head
    ("dtype", lambda: ((bhsd()[0], *bhsd(dtype=torch.float64)[1:]), {})),
    ("dtype", lambda: (tuple(t.to(torch.int32) for t in bhsd()), {})),
    ("device", lambda: (tuple(t.to("meta") for t in bhsd()), {})),
    ("autocast", lambda: (bhsd(), {})),  # float32, under CPU autocast to bfloat16
    ("scale", lambda: (bhsd(), {"scale": -0.125})),
    ("scale", lambda: (bhsd(), {"scale": 0.0})),
    ("scale", lambda: (bhsd(), {"scale": 1e300})),
]


def _same(got, want) -> bool:
    if got.is_nested:
        return all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind()))
    if got.device.type == "meta":
        return got.shape == want.shape and got.dtype == want.dtype and want.device == got.device
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # exactly
    return type(got) is type(want)


def torch_call(args, kwargs):
    """torch's function on the shim's arguments, passed as the shim passes them."""
    bound = inspect.signature(sdpa.scaled_dot_product_attention).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    return TORCH_SDPA(
        a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"], a["is_causal"],
        scale=a["scale"], enable_gqa=a["enable_gqa"],
    )  # fmt: skip


@pytest.mark.parametrize("reason, build", FALLBACKS)
def test_fallback(reason, build):
    with torch.autocast("cpu", torch.bfloat16, enabled=reason == "autocast"):
        fallback(reason, build)


def fallback(reason, build):
    args, kwargs = build()
    assert sdpa.fallback_reason(*args, **kwargs) == reason
    torch.manual_seed(7)  # dropout draws the same mask in both calls
    try:
        want = torch_call(args, kwargs)
    except (RuntimeError, TypeError, ValueError) as e:
        with pytest.raises(type(e)) as raised:
            sdpa.scaled_dot_product_attention(*args, **kwargs)
        assert str(raised.value) == str(e)
    else:
        torch.manual_seed(7)
        assert _same(sdpa.scaled_dot_product_attention(*args, **kwargs), want)
    assert sdpa.fallback_counts() == counted(**{reason: 1})


def test_autocast_in_the_inputs_dtype_runs_fp4attn():
    q, k, v = bhsd(dtype=torch.bfloat16)
    with torch.autocast("cpu", torch.bfloat16):
        o = sdpa.scaled_dot_product_attention(q, k, v)
        o64 = sdpa.scaled_dot_product_attention(*(t.double() for t in (q, k, v)))  # never cast
        assert o.dtype == TORCH_SDPA(q, k, v).dtype == torch.bfloat16
    assert torch.equal(o, fp4attn.attn_func(q, k, v, layout="bhsd"))
    assert o64.dtype == torch.float64
    assert sdpa.fallback_counts() == counted(calls=2)


def test_fallback_works_while_patched():
    q, k, v = bhsd()
    mask = torch.rand(16, 16) > 0.3
    with sdpa.patch():
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(o, TORCH_SDPA(q, k, v, attn_mask=mask))
    assert sdpa.fallback_counts() == counted(attn_mask=1)


@pytest.fixture
def engine(monkeypatch):
    """CUDA decisions without a GPU: _device_reason with the engine said to be there."""
    monkeypatch.setattr(sdpa, "_engine_runs_on", lambda index: True)
    return monkeypatch


def test_cuda_decisions(engine):
    cuda = torch.device("cuda", 0)
    reason = sdpa._device_reason
    assert reason(cuda, torch.bfloat16, "fp8", needs_grad=True) is None
    assert reason(cuda, torch.float16, "nvfp4", needs_grad=False) is None
    assert reason(cuda, torch.float32, "fp8", needs_grad=False) == "dtype"
    assert reason(cuda, torch.bfloat16, "bf16", needs_grad=False) == "recipe"  # CPU only
    engine.setattr(_layout, "GPU_BACKWARD_RECIPES", ("nvfp4",))  # a forward-only recipe
    assert reason(cuda, torch.bfloat16, "fp8", needs_grad=True) == "backward"
    assert reason(cuda, torch.bfloat16, "fp8", needs_grad=False) is None
    engine.setattr(sdpa, "_engine_runs_on", lambda index: False)
    assert reason(cuda, torch.bfloat16, "fp8", needs_grad=False) == "device"
    assert reason(torch.device("xpu", 0), torch.bfloat16, "fp8", needs_grad=False) == "device"
    assert reason(torch.device("cpu"), torch.float64, "bf16", needs_grad=True) is None


def test_no_engine_here():
    if fp4attn.cuda_available():
        pytest.skip("a CUDA build on a GPU machine")
    assert sdpa._ask_engine(0) is False


def test_every_reason_is_tested():
    tested = {reason for reason, _ in FALLBACKS} | {"recipe", "backward"}  # test_cuda_decisions
    assert tested == set(sdpa.REASONS)


def test_bad_recipe_raises_also_on_fallback():
    q, k, v = bhsd()
    for mask in (None, torch.ones(16, 16, dtype=torch.bool)):
        with pytest.raises(ValueError, match="recipe: unknown recipe 'fp5'"):
            sdpa.scaled_dot_product_attention(q, k, v, mask, recipe="fp5")
    with pytest.raises(TypeError, match="recipe: expected a str"):
        sdpa.scaled_dot_product_attention(q, k, v, recipe=8)
    assert sdpa.fallback_counts() == counted()


def test_counts_accumulate_and_reset():
    q, k, v = bhsd()
    for _ in range(2):
        sdpa.scaled_dot_product_attention(q, k, v)
    sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    counts = sdpa.fallback_counts()
    assert counts == counted(calls=2, dropout=1)
    counts["calls"] = 99  # a copy
    assert sdpa.fallback_counts()["calls"] == 2
    sdpa.reset_counts()
    assert sdpa.fallback_counts() == counted()


# ---- patching ----------------------------------------------------------------------------------


def test_patch_restores_the_original():
    from torch.nn.functional import scaled_dot_product_attention as imported_before

    original = F.scaled_dot_product_attention
    with sdpa.patch() as fn:
        assert F.scaled_dot_product_attention is fn is sdpa.scaled_dot_product_attention
        assert imported_before is original  # a name imported before keeps torch's
        with sdpa.patch("nvfp4") as inner:
            assert F.scaled_dot_product_attention is inner
            assert params(inner) == TORCH_PARAMS  # torch's signature exactly
        assert F.scaled_dot_product_attention is fn
    assert F.scaled_dot_product_attention is original
    with pytest.raises(KeyError), sdpa.patch():
        raise KeyError("a failing model")
    assert F.scaled_dot_product_attention is original


def test_patch_refuses_a_bad_recipe_before_patching():
    original = F.scaled_dot_product_attention
    with pytest.raises(ValueError, match="recipe: unknown recipe 'fp5'"), sdpa.patch("fp5"):
        pass
    assert F.scaled_dot_product_attention is original


def test_install_uninstall():
    original = F.scaled_dot_product_attention
    assert sdpa.uninstall() is False
    sdpa.install()
    assert F.scaled_dot_product_attention is sdpa.scaled_dot_product_attention
    sdpa.install("nvfp4")  # again: only the recipe changes
    assert F.scaled_dot_product_attention.fp4attn_recipe == "nvfp4"
    assert sdpa.uninstall() is True
    assert F.scaled_dot_product_attention is original
    assert sdpa.uninstall() is False


def test_install_binds_the_recipe():
    q, k, v = bhsd()
    with sdpa.patch("nvfp4"), fp4attn.use_recipe("mxfp4"):
        o = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(o, fp4attn.attn_func(q, k, v, recipe="nvfp4", layout="bhsd"))


class Attention(torch.nn.Module):
    """A model's attention block: looks F's function up at call time, as diffusers does."""

    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def split(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x, attend=None):
        q, k, v = self.split(x)
        o = (attend or F.scaled_dot_product_attention)(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).flatten(2))


def test_a_model_runs_fp4attn_under_patch():
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(1, 16, 128)
    with torch.no_grad():
        plain = model(x)
        assert torch.equal(plain, model(x, attend=TORCH_SDPA))
        with sdpa.patch():
            patched = model(x)
        assert sdpa.fallback_counts() == counted(calls=1)
        want = model(x, attend=lambda q, k, v, is_causal: fp4attn.attn_func(
            q, k, v, causal=is_causal, layout="bhsd"))  # fmt: skip
        assert torch.equal(patched, want)
        assert not torch.equal(patched, plain)  # quantized: not torch's result
        assert torch.equal(model(x), plain)  # unpatched again


# ---- the default recipe, autograd, torch.compile ----------------------------------------------------


def test_recipe_default_follows_use_recipe():
    q, k, v = bhsd()
    nvfp4 = fp4attn.attn_func(q, k, v, recipe="nvfp4", layout="bhsd")
    with fp4attn.use_recipe("nvfp4"):
        o = sdpa.scaled_dot_product_attention(q, k, v)
        with sdpa.patch():
            patched = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(o, nvfp4) and torch.equal(patched, nvfp4)
    assert not torch.equal(sdpa.scaled_dot_product_attention(q, k, v), nvfp4)  # fp8 again


def test_gradients_equal_attn_funcs():
    def grads(attend):
        q, k, v = (t.requires_grad_() for t in bhsd(h=4, h_kv=2, s_q=16, s_k=24))
        attend(q, k, v).square().sum().backward()
        return q.grad, k.grad, v.grad

    got = grads(lambda q, k, v: sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    want = grads(lambda q, k, v: fp4attn.attn_func(q, k, v, layout="bhsd"))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert sdpa.fallback_counts() == counted(calls=1)


def test_torch_compile_fullgraph():
    q, k, v = bhsd(s_q=16, s_k=32)
    mask = torch.ones(16, 32, dtype=torch.bool)

    def attend(q, k, v):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return causal + F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    with sdpa.patch():
        eager = attend(q, k, v)
        sdpa.reset_counts()
        compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
        outs = [compiled(q, k, v) for _ in range(3)]
    assert all(torch.equal(o, eager) for o in outs)
    # Counts are Python side effects that torch.compile replays on every call.
    assert sdpa.fallback_counts() == counted(calls=3, attn_mask=3)
