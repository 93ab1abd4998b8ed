"""The FlashAttention shims on CUDA tensors (runs on a Hopper GPU; skipped elsewhere): each shim
runs under torch.cuda.set_sync_debug_mode("error") (no host sync, no device-to-host copy: the shims
only check and forward) and equals attn_func / attn_quantized / append_kv + decode bit for bit;
deterministic=True against torch's deterministic switch; FA3's FP8 operands built on the GPU equal
the CPU's bytes."""

from __future__ import annotations

import contextlib

import pytest
import torch

import fp4attn
from fp4attn import PagedKVCache, UnsupportedError, _fa_common, append_kv, decode
from fp4attn import flash_attn as fa2
from fp4attn import flash_attn_interface as fa3

pytestmark = [
    pytest.mark.skipif(
        not (torch.cuda.is_available() and fp4attn._C.has_cuda()),
        reason="needs a CUDA GPU and an fp4attn build with CUDA",
    ),
    pytest.mark.usefixtures("hopper"),  # conftest.py: skips unless the device runs the engine
]

E4M3 = torch.float8_e4m3fn


@contextlib.contextmanager
def no_sync():
    """Any synchronizing CUDA call inside raises (torch's sync debug mode)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _rand(*shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).cuda()


def _qkv(b=2, s_q=200, s_k=333, h=8, h_kv=2, d=128, dtype=torch.bfloat16):
    return _rand(b, s_q, h, d, seed=1, dtype=dtype), *(
        _rand(b, s_k, h_kv, d, seed=s, dtype=dtype) for s in (2, 3)
    )


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _strict(fn, *args, **kwargs):
    """fn's result from a call under the sync debug mode, after a warm-up call outside it (module
    loading and first allocations are not the hot path)."""
    fn(*args, **kwargs)
    with no_sync():
        out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("module", [fa2, fa3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_dense_forward_makes_no_sync(module, causal, recipe):
    q, k, v = _qkv()
    out = _strict(
        module.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True, recipe=recipe
    )
    o, lse = fp4attn.attn_func(q, k, v, causal=causal, recipe=recipe, return_lse=True)
    assert _same(out[0], o) and _same(out[1], lse)
    if module is fa2:
        assert out[2].numel() == 0 and out[2].device == q.device


def test_packed_forward_makes_no_sync():
    q, k, v = _qkv(s_k=200, h_kv=8)
    ref = fp4attn.attn_func(q, k, v, causal=True)
    out = _strict(fa2.flash_attn_qkvpacked_func, torch.stack([q, k, v], 2), causal=True)
    assert _same(out, ref)
    out = _strict(fa2.flash_attn_kvpacked_func, q, torch.stack([k, v], 2), causal=True)
    assert _same(out, ref)


@pytest.mark.parametrize("module", [fa2, fa3])
def test_gradients_equal_attn_funcs_in_deterministic_mode(module):
    q, k, v = _qkv(b=1, s_q=256, s_k=256)
    dout = _rand(1, 256, 8, 128, seed=9)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for fn in (
            lambda *t: module.flash_attn_func(*t, causal=True, deterministic=True),
            lambda *t: fp4attn.attn_func(*t, causal=True),
        ):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            fn(*leaves).backward(dout)
            grads.append([t.grad for t in leaves])
    finally:
        torch.use_deterministic_algorithms(previous)
    for g, g_ref in zip(*grads):
        assert _same(g, g_ref)


def test_deterministic_is_refused_without_torchs_deterministic_mode():
    q, k, v = (t.requires_grad_() for t in _qkv(b=1, s_q=128, s_k=128))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        for module in (fa2, fa3):
            with pytest.raises(UnsupportedError, match="deterministic"):
                module.flash_attn_func(q, k, v, deterministic=True)
            with torch.no_grad():  # no backward can follow: the forward is deterministic
                module.flash_attn_func(q, k, v, deterministic=True)
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_inputs_make_no_sync_and_equal_the_cpu_operands(causal):
    q, k, v = (t.float().mul(4).to(E4M3) for t in _qkv())
    g = torch.Generator().manual_seed(7)
    descales = [(torch.rand(2, 2, generator=g) * 0.2 + 0.05).cuda() for _ in range(3)]
    kw = {"q_descale": descales[0], "k_descale": descales[1], "v_descale": descales[2]}
    o, lse = _strict(fa3.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True, **kw)
    assert o.dtype == torch.bfloat16
    cpu = _fa_common.fp8_operands(q.cpu(), k.cpu(), v.cpu(), *(d.cpu() for d in descales))
    gpu = _fa_common.fp8_operands(q, k, v, *descales)
    for name in fp4attn.QuantizedQKV.TENSORS:
        a, b = getattr(gpu, name).cpu(), getattr(cpu, name)
        if a.dtype == E4M3:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), name
    ref, ref_lse = fp4attn.attn_quantized(cpu.to("cuda"), causal=causal, return_lse=True)
    assert _same(o, ref) and _same(lse, ref_lse)


PAGE = 16
TABLE = [[5, 0, 9, 2, 14, 6], [11, 3, 7, 1, 12, 4]]
CACHED = [70, 33]


def _cache(fmt):
    cache = PagedKVCache.empty(16, PAGE, 2, 128, format=fmt, device="cuda")
    where = [(r, p) for r in range(2) for p in range(CACHED[r])]
    slots = torch.tensor([TABLE[r][p // PAGE] * PAGE + p % PAGE for r, p in where]).cuda()
    append_kv(cache, *(_rand(len(where), 2, 128, seed=s) for s in (11, 12)), slots)
    return cache


@pytest.mark.parametrize("module", [fa2, fa3])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_kvcache_makes_no_sync_and_equals_append_and_decode(module, fmt, num_splits):
    table_name = "block_table" if module is fa2 else "page_table"
    table = torch.tensor(TABLE, dtype=torch.int32).cuda()
    lengths = torch.tensor(CACHED, dtype=torch.int32).cuda()
    q = _rand(2, 4, 8, 128, seed=13)
    k, v = (_rand(2, 4, 2, 128, seed=s) for s in (14, 15))
    ours, warm = _cache(fmt), _cache(fmt)
    kw = {table_name: table, "cache_seqlens": lengths, "causal": True, "num_splits": num_splits,
          "return_softmax_lse": True}  # fmt: skip
    module.flash_attn_with_kvcache(q, warm, None, k, v, **kw)  # warm-up on another cache
    with no_sync():
        out = module.flash_attn_with_kvcache(q, ours, None, k, v, **kw)
    torch.cuda.synchronize()
    ref_cache = _cache(fmt)
    where = [(r, CACHED[r] + j) for r in range(2) for j in range(4)]
    slots = torch.tensor([TABLE[r][p // PAGE] * PAGE + p % PAGE for r, p in where]).cuda()
    append_kv(ref_cache, k.flatten(0, 1), v.flatten(0, 1), slots)
    if num_splits:
        plan = fp4attn.DecodePlan(ref_cache, q, table, num_splits=num_splits)
        ref_o, ref_lse = plan.run(q, ref_cache, table, lengths + 4, return_lse=True)
    else:
        ref_o, ref_lse = decode(q, ref_cache, table, lengths + 4, return_lse=True)
    assert _same(out[0], ref_o) and _same(out[1], ref_lse)
    for name in ("k_data", "v_data", "k_scales", "v_scales", "k_global", "v_global"):
        a, b = getattr(ours, name), getattr(ref_cache, name)
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    ours.check_errors()


def test_fa3_kvcache_packed_new_keys_make_no_sync():
    table = torch.tensor(TABLE, dtype=torch.int32).cuda()
    lengths = torch.tensor(CACHED, dtype=torch.int32).cuda()
    q = _rand(5, 8, 128, seed=16)
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32).cuda()
    k, v = (_rand(6, 2, 128, seed=s) for s in (17, 18))
    cu_new = torch.tensor([0, 2, 5], dtype=torch.int32).cuda()  # token 5 is padding
    kw = {"cache_seqlens": lengths, "page_table": table, "cu_seqlens_q": cu_q,
          "cu_seqlens_k_new": cu_new, "max_seqlen_q": 3, "causal": True,
          "return_softmax_lse": True}  # fmt: skip
    fa3.flash_attn_with_kvcache(q, _cache("nvfp4"), None, k, v, **kw)
    ours = _cache("nvfp4")
    with no_sync():
        o, lse, *_ = fa3.flash_attn_with_kvcache(q, ours, None, k, v, **kw)
    ref_cache = _cache("nvfp4")
    where = [(0, 70), (0, 71), (1, 33), (1, 34), (1, 35)]
    slots = torch.tensor([TABLE[r][p // PAGE] * PAGE + p % PAGE for r, p in where]).cuda()
    append_kv(ref_cache, k[:5], v[:5], slots)
    seq_lens = torch.tensor([72, 36], dtype=torch.int32).cuda()
    ref_o, ref_lse = decode(q, ref_cache, table, seq_lens, cu_seqlens_q=cu_q, return_lse=True)
    assert _same(o, ref_o) and _same(lse, ref_lse)
    ours.check_errors()


@pytest.mark.parametrize("module", [fa2, fa3])
def test_varlen_equals_attn_varlen_func(module):
    # Not under the sync debug mode: attn_varlen_func reads cu_seqlens on the host (varlen.py).
    lengths = [100, 0, 257]
    cu = torch.tensor([0, 100, 100, 357], dtype=torch.int32).cuda()
    q = _rand(357, 8, 128, seed=19)
    k, v = (_rand(357, 2, 128, seed=s) for s in (20, 21))
    out = module.flash_attn_varlen_func(
        q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_attn_probs=True
    )
    o, lse = fp4attn.attn_varlen_func(q, k, v, cu, cu, 257, 257, causal=True, return_lse=True)
    assert _same(out[0], o) and _same(out[1], lse)
