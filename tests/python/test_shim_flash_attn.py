"""The FlashAttention shims on CPU tensors (fp4attn.flash_attn: FA2's API,
fp4attn.flash_attn_interface: FA3's): signatures as FlashAttention's, positional orders, every
default accepted, every value fp4attn does not implement refused by name, results equal to
attn_func / attn_varlen_func / append_kv + decode bit for bit, the recipe keyword and the process
default, gradients, FA3's FP8 inputs on operands built from their codes, and the kvcache rule (a
PagedKVCache)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import fp4attn
from fp4attn import PagedKVCache, UnsupportedError, append_kv, decode
from fp4attn import flash_attn as fa2
from fp4attn import flash_attn_interface as fa3

E4M3 = torch.float8_e4m3fn
WINDOW = (-1, -1)  # window_size's default

# FlashAttention's parameter lists (flash_attn 2.8.4; hopper/flash_attn_interface.py of FA3 at
# Dao-AILab/flash-attention 0251105a2fb1), in order, with their defaults (REQUIRED: none).
REQUIRED = object()
FA2_DENSE = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
             ("window_size", WINDOW), ("softcap", 0.0), ("alibi_slopes", None),
             ("deterministic", False), ("return_attn_probs", False)]  # fmt: skip
FA3_DENSE_TAIL = [("qv", None), ("q_descale", None), ("k_descale", None), ("v_descale", None),
                  ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0),
                  ("num_splits", 1), ("pack_gqa", None), ("deterministic", False),
                  ("sm_margin", 0), ("return_attn_probs", False)]  # fmt: skip
QKV = [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED)]
CU = [("cu_seqlens_q", REQUIRED), ("cu_seqlens_k", REQUIRED), ("max_seqlen_q", REQUIRED),
      ("max_seqlen_k", REQUIRED)]  # fmt: skip
SIGNATURES = {
    (fa2, "flash_attn_func"): QKV + FA2_DENSE,
    (fa2, "flash_attn_qkvpacked_func"): [("qkv", REQUIRED)] + FA2_DENSE,
    (fa2, "flash_attn_kvpacked_func"): [("q", REQUIRED), ("kv", REQUIRED)] + FA2_DENSE,
    (fa2, "flash_attn_varlen_func"): QKV + CU + FA2_DENSE + [("block_table", None)],
    (fa2, "flash_attn_varlen_qkvpacked_func"): [("qkv", REQUIRED), ("cu_seqlens", REQUIRED),
                                                ("max_seqlen", REQUIRED)] + FA2_DENSE,
    (fa2, "flash_attn_varlen_kvpacked_func"): [("q", REQUIRED), ("kv", REQUIRED)] + CU + FA2_DENSE,
    (fa2, "flash_attn_with_kvcache"): [
        ("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", WINDOW), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False)],
    (fa3, "flash_attn_func"): QKV + [("softmax_scale", None), ("causal", False)] + FA3_DENSE_TAIL,
    (fa3, "flash_attn_qkvpacked_func"): [
        ("qkv", REQUIRED), ("softmax_scale", None), ("causal", False), ("q_descale", None),
        ("k_descale", None), ("v_descale", None), ("window_size", WINDOW), ("attention_chunk", 0),
        ("softcap", 0.0), ("deterministic", False), ("num_heads_q", None), ("sm_margin", 0),
        ("return_attn_probs", False)],
    (fa3, "flash_attn_varlen_func"): QKV + CU + [("seqused_q", None), ("seqused_k", None),
                                                 ("softmax_scale", None), ("causal", False)]
    + FA3_DENSE_TAIL,
    (fa3, "flash_attn_with_kvcache"): [
        ("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None), ("v", None),
        ("qv", None), ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("page_table", None),
        ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None),
        ("rotary_seqlens", None), ("q_descale", None), ("k_descale", None), ("v_descale", None),
        ("softmax_scale", None), ("causal", False), ("window_size", WINDOW), ("attention_chunk", 0),
        ("softcap", 0.0), ("rotary_interleaved", True), ("scheduler_metadata", None),
        ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0), ("return_softmax_lse", False)],
}  # fmt: skip


def _rand(*shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _qkv(b=2, s_q=24, s_k=40, h=4, h_kv=2, d=64, dtype=torch.bfloat16):
    return _rand(b, s_q, h, d, seed=1, dtype=dtype), *(
        _rand(b, s_k, h_kv, d, seed=s, dtype=dtype) for s in (2, 3)
    )


def _same(a, b) -> bool:
    """Bit-for-bit equality of outputs (same dtype, shape and values)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _defaults(fn, skip=()) -> dict:
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty and name not in skip
    }


# ---- signatures -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(SIGNATURES), ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_signature_is_flash_attentions_plus_keyword_only_recipe(key):
    module, name = key
    params = list(inspect.signature(getattr(module, name)).parameters.values())
    *fa, recipe = params
    assert [p.name for p in fa] == [n for n, _ in SIGNATURES[key]]
    for p, (n, default) in zip(fa, SIGNATURES[key]):
        assert p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, n
        want = inspect.Parameter.empty if default is REQUIRED else default
        assert p.default == want, n
    assert recipe.name == "recipe" and recipe.default is None
    assert recipe.kind == inspect.Parameter.KEYWORD_ONLY
    assert name in module.__all__


# ---- positional orders ------------------------------------------------------------------------


def test_fa2_fourth_positional_is_dropout_p():
    q, k, v = _qkv()
    with pytest.raises(UnsupportedError, match="dropout_p"):
        fa2.flash_attn_func(q, k, v, 0.1)
    o = fa2.flash_attn_func(q, k, v, 0.0, 0.5)
    assert _same(o, fp4attn.attn_func(q, k, v, softmax_scale=0.5))
    assert not _same(o, fp4attn.attn_func(q, k, v))
    o = fa2.flash_attn_func(q, k, v, 0.0, None, True)
    assert _same(o, fp4attn.attn_func(q, k, v, causal=True))


def test_fa3_fourth_positional_is_softmax_scale():
    q, k, v = _qkv()
    assert _same(fa3.flash_attn_func(q, k, v, 0.5), fp4attn.attn_func(q, k, v, softmax_scale=0.5))
    o = fa3.flash_attn_func(q, k, v, 0.5, True)
    assert _same(o, fp4attn.attn_func(q, k, v, softmax_scale=0.5, causal=True))


@pytest.mark.parametrize("module", [fa2, fa3])
def test_recipe_is_keyword_only(module):
    q, k, v = _qkv()
    defaults = [d for _, d in SIGNATURES[(module, "flash_attn_func")][3:]]
    assert _same(module.flash_attn_func(q, k, v, *defaults), fp4attn.attn_func(q, k, v))
    with pytest.raises(TypeError, match="positional"):
        module.flash_attn_func(q, k, v, *defaults, "nvfp4")


# ---- every default accepted -------------------------------------------------------------------


@pytest.mark.parametrize("module", [fa2, fa3])
def test_dense_with_every_keyword_at_its_default(module):
    q, k, v = _qkv()
    kw = _defaults(module.flash_attn_func)
    assert _same(module.flash_attn_func(q, k, v, **kw), fp4attn.attn_func(q, k, v))
    qkv = torch.stack(_qkv(h_kv=4, s_k=24), dim=2)
    kw = _defaults(module.flash_attn_qkvpacked_func)
    ref = fp4attn.attn_func(*qkv.unbind(2))
    assert _same(module.flash_attn_qkvpacked_func(qkv, **kw), ref)
    if module is fa2:
        kw = _defaults(fa2.flash_attn_kvpacked_func)
        out = fa2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw)
        assert _same(out, fp4attn.attn_func(q, k, v))


def _packed_batch(lengths_q=(9, 0, 17), lengths_k=(12, 5, 20), h=4, h_kv=2, d=64):
    def cu(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    q = _rand(sum(lengths_q), h, d, seed=4)
    k, v = (_rand(sum(lengths_k), h_kv, d, seed=s) for s in (5, 6))
    return q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k)


@pytest.mark.parametrize("module", [fa2, fa3])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_equals_attn_varlen_func(module, causal):
    q, k, v, cu_q, cu_k, mq, mk = _packed_batch()
    kw = _defaults(module.flash_attn_varlen_func, skip=("causal", "return_attn_probs"))
    out = module.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_attn_probs=True, **kw
    )
    ref_o, ref_lse = fp4attn.attn_varlen_func(
        q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_lse=True
    )
    assert _same(out[0], ref_o) and _same(out[1], ref_lse)
    assert out[1].shape == (q.shape[1], q.shape[0])  # FA's varlen LSE layout [h, total_q]
    if module is fa2:
        assert len(out) == 3 and out[2].shape == (0,) and out[2].dtype == q.dtype
    else:
        assert len(out) == 2


def test_fa2_packed_varlen_functions_equal_the_unpacked_ones():
    q, k, v, cu_q, _, mq, _ = _packed_batch(lengths_k=(9, 0, 17), h_kv=4)
    qkv = torch.stack([q, k, v], dim=1)
    ref = fp4attn.attn_varlen_func(q, k, v, cu_q, cu_q, mq, mq, causal=True)
    kw = _defaults(fa2.flash_attn_varlen_qkvpacked_func, skip=("causal",))
    assert _same(fa2.flash_attn_varlen_qkvpacked_func(qkv, cu_q, mq, causal=True, **kw), ref)
    kv = torch.stack([k, v], dim=1)
    kw = _defaults(fa2.flash_attn_varlen_kvpacked_func, skip=("causal",))
    out = fa2.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_q, mq, mq, causal=True, **kw)
    assert _same(out, ref)


def test_fa2_kvpacked_and_fa3_packed_heads():
    q, k, v = _qkv()
    ref, ref_lse = fp4attn.attn_func(q, k, v, causal=True, return_lse=True)
    o, lse, s_dmask = fa2.flash_attn_kvpacked_func(
        q, torch.stack([k, v], dim=2), causal=True, return_attn_probs=True
    )
    assert _same(o, ref) and _same(lse, ref_lse) and s_dmask.numel() == 0
    # FA3's rank-4 qkv: the heads of q, k and v side by side, split by num_heads_q.
    q1, k1, v1 = _qkv(s_k=24)
    qkv = torch.cat([q1, k1, v1], dim=2)
    o, lse = fa3.flash_attn_qkvpacked_func(qkv, num_heads_q=4, return_attn_probs=True)
    ref, ref_lse = fp4attn.attn_func(q1, k1, v1, return_lse=True)
    assert _same(o, ref) and _same(lse, ref_lse)
    with pytest.raises(ValueError, match="num_heads_q"):
        fa3.flash_attn_qkvpacked_func(qkv, num_heads_q=3)


@pytest.mark.parametrize("module", [fa2, fa3])
def test_return_attn_probs_gives_attn_funcs_lse(module):
    q, k, v = _qkv()
    out = module.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    o, lse = fp4attn.attn_func(q, k, v, causal=True, return_lse=True)
    assert _same(out[0], o) and _same(out[1], lse) and lse.shape == (2, 4, 24)
    assert len(out) == (3 if module is fa2 else 2)


# ---- recipes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [fa2, fa3])
def test_recipe_keyword_and_the_process_default(module):
    q, k, v = _qkv()
    fp8 = fp4attn.attn_func(q, k, v, recipe="fp8")
    nvfp4 = fp4attn.attn_func(q, k, v, recipe="nvfp4")
    assert not _same(fp8, nvfp4)
    assert _same(module.flash_attn_func(q, k, v, recipe="nvfp4"), nvfp4)
    with fp4attn.use_recipe("nvfp4"):
        assert _same(module.flash_attn_func(q, k, v), nvfp4)
        assert _same(module.flash_attn_func(q, k, v, recipe="fp8"), fp8)
    previous = fp4attn.set_default_recipe("nvfp4")
    try:
        assert _same(module.flash_attn_func(q, k, v), nvfp4)
    finally:
        fp4attn.set_default_recipe(previous)
    assert _same(module.flash_attn_func(q, k, v), fp8)
    with pytest.raises(ValueError, match="recipe"):
        module.flash_attn_func(q, k, v, recipe="fp3")


# ---- gradients --------------------------------------------------------------------------------


def _grads(fn, tensors, dout):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    o = fn(*leaves)
    o.backward(dout)
    return o, [t.grad for t in leaves]


@pytest.mark.parametrize("module", [fa2, fa3])
def test_gradients_equal_attn_funcs(module):
    q, k, v = _qkv(b=1, s_q=16, s_k=32, dtype=torch.float32)
    dout = _rand(1, 16, 4, 64, seed=9, dtype=torch.float32)

    def ours(q, k, v):
        return module.flash_attn_func(q, k, v, causal=True, deterministic=True)

    def ref(q, k, v):
        return fp4attn.attn_func(q, k, v, causal=True)

    o, grads = _grads(ours, (q, k, v), dout)
    o_ref, grads_ref = _grads(ref, (q, k, v), dout)
    assert _same(o, o_ref)
    for g, g_ref, name in zip(grads, grads_ref, "qkv"):
        assert g is not None and _same(g, g_ref), name
        assert g.abs().sum() > 0, name


def test_gradients_reach_a_packed_qkv():
    qkv = torch.stack(_qkv(b=1, s_q=16, s_k=16, h_kv=4, dtype=torch.float32), dim=2)
    dout = _rand(1, 16, 4, 64, seed=9, dtype=torch.float32)
    leaf = qkv.clone().requires_grad_()
    fa2.flash_attn_qkvpacked_func(leaf, causal=True).backward(dout)
    _, grads = _grads(lambda q, k, v: fp4attn.attn_func(q, k, v, causal=True), qkv.unbind(2), dout)
    assert _same(leaf.grad, torch.stack(grads, dim=2))


# ---- refused by name --------------------------------------------------------------------------

DENSE_REFUSED = [
    (fa2, "dropout_p", 0.1, UnsupportedError),
    (fa2, "dropout_p", 1.5, ValueError),
    (fa2, "dropout_p", "0", TypeError),
    (fa2, "window_size", (128, 0), UnsupportedError),
    (fa2, "window_size", (-1, 0), UnsupportedError),
    (fa2, "window_size", 128, TypeError),
    (fa2, "softcap", 30.0, UnsupportedError),
    (fa2, "alibi_slopes", torch.ones(4), UnsupportedError),
    (fa2, "deterministic", 1, TypeError),
    (fa2, "return_attn_probs", 1, TypeError),
    (fa3, "qv", torch.ones(2, 24, 4, 64), UnsupportedError),
    (fa3, "q_descale", torch.ones(2, 2), ValueError),  # 16-bit inputs take no descale
    (fa3, "k_descale", torch.ones(2, 2), ValueError),
    (fa3, "v_descale", torch.ones(2, 2), ValueError),
    (fa3, "window_size", (64, 64), UnsupportedError),
    (fa3, "attention_chunk", 128, UnsupportedError),
    (fa3, "attention_chunk", -1, ValueError),
    (fa3, "softcap", 15.0, UnsupportedError),
    (fa3, "num_splits", 4, UnsupportedError),
    (fa3, "num_splits", -1, ValueError),
    (fa3, "pack_gqa", 1, TypeError),
    (fa3, "sm_margin", 8, UnsupportedError),
    (fa3, "deterministic", None, TypeError),
    (fa3, "return_attn_probs", None, TypeError),
]


@pytest.mark.parametrize(
    ("module", "name", "value", "error"),
    DENSE_REFUSED,
    ids=[f"{m.__name__.split('.')[-1]}-{n}-{v!r:.12}" for m, n, v, _ in DENSE_REFUSED],
)
def test_dense_refuses_by_name(module, name, value, error):
    q, k, v = _qkv()
    with pytest.raises(error, match=name):
        module.flash_attn_func(q, k, v, **{name: value})


VARLEN_REFUSED = [
    (fa2, "block_table", torch.zeros(3, 2, dtype=torch.int32), UnsupportedError),
    (fa2, "dropout_p", 0.5, UnsupportedError),
    (fa2, "softcap", 1.0, UnsupportedError),
    (fa3, "seqused_q", torch.ones(3, dtype=torch.int32), UnsupportedError),
    (fa3, "seqused_k", torch.ones(3, dtype=torch.int32), UnsupportedError),
    (fa3, "window_size", (8, 8), UnsupportedError),
    (fa3, "num_splits", 2, UnsupportedError),
    (fa3, "q_descale", torch.ones(3, 2), ValueError),
]


@pytest.mark.parametrize(
    ("module", "name", "value", "error"),
    VARLEN_REFUSED,
    ids=[f"{m.__name__.split('.')[-1]}-{n}" for m, n, _, _ in VARLEN_REFUSED],
)
def test_varlen_refuses_by_name(module, name, value, error):
    q, k, v, cu_q, cu_k, mq, mk = _packed_batch()
    with pytest.raises(error, match=name):
        module.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, **{name: value})


def test_accepted_hints_do_not_change_the_result():
    q, k, v = _qkv()
    ref = fp4attn.attn_func(q, k, v)
    for kw in ({"pack_gqa": True}, {"pack_gqa": False}, {"num_splits": 0}):
        assert _same(fa3.flash_attn_func(q, k, v, **kw), ref), kw
    for window in ([-1, -1], (-1, -1)):
        assert _same(fa2.flash_attn_func(q, k, v, window_size=window), ref)


# ---- FA3's FP8 inputs -------------------------------------------------------------------------

# numerics.md §3: position p of each 16-key group of V^T holds key 16g + 2(p>>2) + (p&1) +
# 8((p>>1)&1).
V_ORDER = [2 * (p >> 2) + (p & 1) + 8 * ((p >> 1) & 1) for p in range(16)]


def _fp8_inputs(b=2, s_q=24, s_k=40, h=4, h_kv=2, d=64):
    q, k, v = (x.float() * 4 for x in _qkv(b, s_q, s_k, h, h_kv, d))
    codes = [x.to(E4M3) for x in (q, k, v)]
    g = torch.Generator().manual_seed(7)
    descales = [torch.rand(b, h_kv, generator=g) * 0.2 + 0.05 for _ in range(3)]
    return codes, descales


def _operands_by_hand(q, k, v, q_descale, k_descale, v_descale) -> fp4attn.QuantizedQKV:
    """The fp8 operands of FP8 codes, written from operands.h's layouts with plain loops."""
    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    group = h // h_kv
    q_data = torch.empty(b, h, s_q, d, dtype=torch.uint8)
    q_scale = torch.empty(b, h, math.ceil(s_q / 128))
    k_data = torch.empty(b, h_kv, s_k, d, dtype=torch.uint8)
    k_scale = torch.empty(b, h_kv, math.ceil(s_k / 128))
    pitch = math.ceil(s_k / 16) * 16
    v_data = torch.zeros(b, h_kv, d, pitch, dtype=torch.uint8)
    v_scale = torch.empty(b, h_kv, d)
    qb, kb, vb = (x.view(torch.uint8) for x in (q, k, v))
    for i in range(b):
        for j in range(h):
            q_data[i, j] = qb[i, :, j]
            q_scale[i, j] = q_descale[i, j // group]
        for j in range(h_kv):
            k_data[i, j] = kb[i, :, j]
            k_scale[i, j] = k_descale[i, j]
            v_scale[i, j] = v_descale[i, j]
            for p in range(pitch):
                key = p // 16 * 16 + V_ORDER[p % 16]
                if key < s_k:
                    v_data[i, j, :, p] = vb[i, key, j]
    return fp4attn.QuantizedQKV(
        q_data.view(E4M3), q_scale, k_data.view(E4M3), k_scale, v_data.view(E4M3), v_scale,
        "fp8", torch.bfloat16,
    )  # fmt: skip


def _attention_f64(q, k, v, causal, scale):
    """float64 attention, BSHD, GQA, causal bottom-right; returns (o, lse)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s_q, s_k = s.shape[-2:]
        keep = torch.arange(s_k)[None] <= torch.arange(s_q)[:, None] + s_k - s_q
        s = s.masked_fill(~keep, -math.inf)
    return (torch.softmax(s, -1) @ v).transpose(1, 2), torch.logsumexp(s, -1)


def _dequantized(codes, descales):
    """The values FA3's FP8 inputs stand for: codes x the descale of their (batch, kv head)."""
    q, k, v = (c.double() for c in codes)
    group = q.shape[2] // k.shape[2]
    qd, kd, vd = (x.double()[:, None, :, None] for x in descales)
    return q * qd.repeat_interleave(group, 2), k * kd, v * vd


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_inputs_run_on_their_own_codes(causal):
    codes, descales = _fp8_inputs()
    o, lse = fa3.flash_attn_func(
        *codes, causal=causal, q_descale=descales[0], k_descale=descales[1],
        v_descale=descales[2], return_attn_probs=True,
    )  # fmt: skip
    assert o.dtype == torch.bfloat16 and o.shape == codes[0].shape  # FA3: BF16 for FP8 inputs
    ref, ref_lse = fp4attn.attn_quantized(
        _operands_by_hand(*codes, *descales), causal=causal, return_lse=True
    )
    assert _same(o, ref) and _same(lse, ref_lse)
    want, want_lse = _attention_f64(*_dequantized(codes, descales), causal, 1 / 8)
    rel = float((o.double() - want).norm() / want.norm())
    # P in E4M3 (3 mantissa bits: up to 1/16 relative per element) and the BF16 output are the
    # only roundings left; a wrong descale per head would be off by its factor (0.05 to 0.25).
    assert rel < 0.04, rel
    assert float((lse.double() - want_lse).abs().max()) < 1e-3


def test_fp8_descales_default_to_one_and_scale_the_scores():
    codes, _ = _fp8_inputs(b=1)
    ones = [torch.ones(1, 2) for _ in range(3)]
    o = fa3.flash_attn_func(*codes, 0.25)
    assert _same(o, fa3.flash_attn_func(*codes, 0.25, q_descale=ones[0], k_descale=ones[1]))
    half = torch.full((1, 2), 0.5)
    # q_descale 0.5 with softmax_scale 0.5 is the same S as softmax_scale 0.25.
    assert _same(o, fa3.flash_attn_func(*codes, 0.5, q_descale=half))
    assert _same(o * 2, fa3.flash_attn_func(*codes, 0.25, v_descale=torch.full((1, 2), 2.0)))


def test_fp8_varlen_runs_each_sequence_on_its_operands():
    lengths_q, lengths_k = (9, 0, 17), (12, 5, 20)
    q, k, v = (_rand(n, h, 64, seed=s, dtype=torch.float32).mul(4).to(E4M3) for n, h, s in (
        (sum(lengths_q), 4, 1), (sum(lengths_k), 2, 2), (sum(lengths_k), 2, 3)))  # fmt: skip
    cu_q, cu_k = (
        torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32)
        for x in (lengths_q, lengths_k)
    )
    descales = [torch.rand(3, 2, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    o, lse = fa3.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 17, 20, causal=True, q_descale=descales[0], k_descale=descales[1],
        v_descale=descales[2], return_attn_probs=True,
    )  # fmt: skip
    assert o.dtype == torch.bfloat16 and lse.shape == (4, sum(lengths_q))
    for i in range(3):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if q1 == q0:
            continue
        ref, ref_lse = fa3.flash_attn_func(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=True,
            q_descale=descales[0][i : i + 1], k_descale=descales[1][i : i + 1],
            v_descale=descales[2][i : i + 1], return_attn_probs=True,
        )  # fmt: skip
        assert _same(o[q0:q1], ref[0]) and _same(lse[:, q0:q1], ref_lse[0])


def test_fp8_refusals():
    codes, _ = _fp8_inputs(b=1)
    with pytest.raises(UnsupportedError, match="recipe"):
        fa3.flash_attn_func(*codes, recipe="nvfp4")
    with fp4attn.use_recipe("mxfp4"), pytest.raises(UnsupportedError, match="recipe"):
        fa3.flash_attn_func(*codes)
    with pytest.raises(TypeError, match="k: dtype"):
        fa3.flash_attn_func(codes[0], codes[1].bfloat16(), codes[2])
    with pytest.raises(ValueError, match="q_descale"):
        fa3.flash_attn_func(*codes, q_descale=torch.ones(1, 4))  # (batch, kv_heads) = (1, 2)
    with pytest.raises(TypeError, match="k_descale"):
        fa3.flash_attn_func(*codes, k_descale=torch.ones(1, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="v_descale"):
        fa3.flash_attn_func(*codes, v_descale=-torch.ones(1, 2))
    leaf = codes[0].clone().requires_grad_()
    with pytest.raises(UnsupportedError, match="backward"):
        fa3.flash_attn_func(leaf, *codes[1:])


# ---- flash_attn_with_kvcache over a PagedKVCache ----------------------------------------------

PAGE, PAGES, KV_HEADS = 8, 12, 2
TABLE = torch.tensor([[5, 0, 9, 2], [11, 3, 7, 1]], dtype=torch.int32)  # capacity 32 each
CACHED = torch.tensor([13, 6], dtype=torch.int32)


def _slots(rows_and_positions):
    return torch.tensor(
        [int(TABLE[r, p // PAGE]) * PAGE + p % PAGE for r, p in rows_and_positions],
        dtype=torch.int64,
    )


def _cache(fmt="nvfp4"):
    """A cache with CACHED[i] tokens of sequence i already appended (the same bytes each time)."""
    cache = PagedKVCache.empty(PAGES, PAGE, KV_HEADS, 64, format=fmt)
    where = [(r, p) for r in range(2) for p in range(int(CACHED[r]))]
    k, v = (_rand(len(where), KV_HEADS, 64, seed=s) for s in (11, 12))
    append_kv(cache, k, v, _slots(where))
    return cache


def _cache_bytes(cache):
    return [t.view(torch.uint8).clone() for t in (cache.k_data, cache.v_data) if t is not None]


@pytest.mark.parametrize("module", [fa2, fa3])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_appends_then_decodes(module, fmt, causal):
    table_name = "block_table" if module is fa2 else "page_table"
    q = _rand(2, 3, 4, 64, seed=13)
    k, v = (_rand(2, 3, KV_HEADS, 64, seed=s) for s in (14, 15))
    ours = _cache(fmt)
    kw = _defaults(module.flash_attn_with_kvcache, skip=("k", "v", table_name, "causal"))
    kw.update(cache_seqlens=CACHED, causal=causal, return_softmax_lse=True)
    out = module.flash_attn_with_kvcache(q, ours, None, k, v, **{table_name: TABLE}, **kw)
    ref_cache = _cache(fmt)
    where = [(r, int(CACHED[r]) + j) for r in range(2) for j in range(3)]
    append_kv(ref_cache, k.flatten(0, 1), v.flatten(0, 1), _slots(where))
    ref_o, ref_lse = decode(q, ref_cache, TABLE, CACHED + 3, causal=causal, return_lse=True)
    assert _same(out[0], ref_o) and _same(out[1], ref_lse) and ref_lse.shape == (2, 4, 3)
    for a, b in zip(_cache_bytes(ours), _cache_bytes(ref_cache)):
        assert torch.equal(a, b)
    if module is fa3:  # (out, softmax_lse, out_accum, softmax_lse_accum), the last two empty
        assert len(out) == 4 and out[2].numel() == 0 and out[3].numel() == 0
    else:
        assert len(out) == 2


@pytest.mark.parametrize("module", [fa2, fa3])
def test_kvcache_without_new_tokens_and_int_lengths(module):
    table_name = "block_table" if module is fa2 else "page_table"
    q = _rand(2, 1, 4, 64, seed=16)
    cache = _cache()
    # cache_seqlens None: every sequence spans its whole table row (FA's paged default).
    kw = _defaults(module.flash_attn_with_kvcache, skip=(table_name,))
    full = torch.full((2,), TABLE.shape[1] * PAGE, dtype=torch.int32)
    out = module.flash_attn_with_kvcache(q, cache, cache, **{table_name: TABLE}, **kw)
    assert _same(out, decode(q, cache, TABLE, full, causal=False))
    out = module.flash_attn_with_kvcache(
        q, cache, None, cache_seqlens=6, causal=True, **{table_name: TABLE}
    )
    assert _same(out, decode(q, cache, TABLE, torch.tensor([6, 6], dtype=torch.int32)))
    splits = module.flash_attn_with_kvcache(
        q, cache, None, cache_seqlens=CACHED, num_splits=2, **{table_name: TABLE}
    )
    assert _same(splits, decode(q, cache, TABLE, CACHED, causal=False))


def test_fa3_kvcache_varlen_queries_and_packed_new_keys():
    # Sequence 0 gets 2 new tokens and 3 queries, sequence 1 one of each; the 4th packed token
    # lies past cu_seqlens_k_new[-1] and is not appended.
    q = _rand(4, 4, 64, seed=17)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32)
    k, v = (_rand(4, KV_HEADS, 64, seed=s) for s in (18, 19))
    cu_new = torch.tensor([0, 2, 3], dtype=torch.int32)
    ours = _cache()
    o, lse, *_ = fa3.flash_attn_with_kvcache(
        q, ours, None, k, v, cache_seqlens=CACHED, page_table=TABLE, cu_seqlens_q=cu_q,
        cu_seqlens_k_new=cu_new, max_seqlen_q=3, causal=True, return_softmax_lse=True,
    )  # fmt: skip
    ref_cache = _cache()
    where = [(0, 13), (0, 14), (1, 6)]
    append_kv(ref_cache, k[:3], v[:3], _slots(where))
    seq_lens = torch.tensor([15, 7], dtype=torch.int32)
    ref_o, ref_lse = decode(q, ref_cache, TABLE, seq_lens, cu_seqlens_q=cu_q, return_lse=True)
    assert _same(o, ref_o) and _same(lse, ref_lse) and lse.shape == (4, 4)
    for a, b in zip(_cache_bytes(ours), _cache_bytes(ref_cache)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("module", [fa2, fa3])
def test_kvcache_needs_a_paged_kv_cache(module):
    table_name = "block_table" if module is fa2 else "page_table"
    q = _rand(2, 1, 4, 64, seed=20)
    plain = torch.zeros(PAGES, PAGE, KV_HEADS, 64, dtype=torch.bfloat16)
    tables = {table_name: TABLE}
    with pytest.raises(TypeError, match=r"k_cache: expected a fp4attn\.PagedKVCache.*quantized"):
        module.flash_attn_with_kvcache(q, plain, plain, cache_seqlens=CACHED, **tables)
    cache = _cache()
    with pytest.raises(TypeError, match="v_cache"):
        module.flash_attn_with_kvcache(q, cache, plain, cache_seqlens=CACHED, **tables)
    with pytest.raises(ValueError, match="v_cache"):
        module.flash_attn_with_kvcache(q, cache, _cache(), cache_seqlens=CACHED, **tables)
    with pytest.raises(ValueError, match=table_name):
        module.flash_attn_with_kvcache(q, cache, None, cache_seqlens=CACHED)
    with pytest.raises(TypeError, match=table_name):
        module.flash_attn_with_kvcache(q, cache, None, cache_seqlens=CACHED,
                                       **{table_name: TABLE.long()})  # fmt: skip
    k = _rand(2, 1, KV_HEADS, 64, seed=21)
    with pytest.raises(ValueError, match="cache_seqlens: required"):
        module.flash_attn_with_kvcache(q, cache, None, k, k, **tables)
    with pytest.raises(ValueError, match="k/v"):
        module.flash_attn_with_kvcache(q, cache, None, k, None, cache_seqlens=CACHED, **tables)
    with pytest.raises(TypeError, match="cache_seqlens"):
        module.flash_attn_with_kvcache(q, cache, None, cache_seqlens=CACHED.long(), **tables)
    # 30 cached + 3 new tokens do not fit a row of 4 pages of 8.
    k3 = _rand(2, 3, KV_HEADS, 64, seed=22)
    with pytest.raises(ValueError, match="beyond the 32 slots"):
        module.flash_attn_with_kvcache(q, cache, None, k3, k3, cache_seqlens=30, **tables)


KVCACHE_REFUSED = [
    (fa2, "rotary_cos", torch.ones(32, 32)),
    (fa2, "rotary_sin", torch.ones(32, 32)),
    (fa2, "cache_batch_idx", torch.arange(2, dtype=torch.int32)),
    (fa2, "cache_leftpad", torch.zeros(2, dtype=torch.int32)),
    (fa2, "window_size", (16, 0)),
    (fa2, "softcap", 50.0),
    (fa2, "alibi_slopes", torch.ones(4)),
    (fa2, "recipe", "fp8"),
    (fa3, "qv", torch.ones(2, 1, 4, 64)),
    (fa3, "rotary_cos", torch.ones(32, 32)),
    (fa3, "rotary_seqlens", torch.zeros(2, dtype=torch.int32)),
    (fa3, "cache_batch_idx", torch.arange(2, dtype=torch.int32)),
    (fa3, "cache_leftpad", torch.zeros(2, dtype=torch.int32)),
    (fa3, "q_descale", torch.ones(2, 2)),
    (fa3, "k_descale", torch.ones(2, 2)),
    (fa3, "v_descale", torch.ones(2, 2)),
    (fa3, "window_size", (16, 0)),
    (fa3, "attention_chunk", 64),
    (fa3, "softcap", 50.0),
    (fa3, "scheduler_metadata", torch.zeros(8, dtype=torch.int32)),
    (fa3, "sm_margin", 4),
    (fa3, "recipe", "nvfp4"),
]


@pytest.mark.parametrize(
    ("module", "name", "value"),
    KVCACHE_REFUSED,
    ids=[f"{m.__name__.split('.')[-1]}-{n}" for m, n, _ in KVCACHE_REFUSED],
)
def test_kvcache_refuses_by_name(module, name, value):
    table_name = "block_table" if module is fa2 else "page_table"
    q = _rand(2, 1, 4, 64, seed=23)
    with pytest.raises(UnsupportedError, match=name):
        module.flash_attn_with_kvcache(
            q, _cache(), None, cache_seqlens=CACHED, **{table_name: TABLE, name: value}
        )


def test_kvcache_type_errors_name_the_argument():
    q = _rand(2, 1, 4, 64, seed=24)
    for name, value in (("num_splits", 1.0), ("rotary_interleaved", 0), ("pack_gqa", "yes"),
                        ("max_seqlen_q", 2.0), ("return_softmax_lse", None)):  # fmt: skip
        with pytest.raises(TypeError, match=name):
            fa3.flash_attn_with_kvcache(
                q, _cache(), None, cache_seqlens=CACHED, page_table=TABLE, **{name: value}
            )
    with pytest.raises(ValueError, match="num_splits"):
        fa2.flash_attn_with_kvcache(
            q, _cache(), None, cache_seqlens=CACHED, block_table=TABLE, num_splits=-1
        )
