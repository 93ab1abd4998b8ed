"""The paged KV cache on the CPU path (fp4attn.PagedKVCache, append_kv, decode): the bytes of an
append against an NVFP4 / FP8 codec written here independently, the calibration of the globals by
the first append with data (an append of zeros leaves them 0), skipped slots, decode against
float64 attention over the decoded cache (shuffled pages, ragged lengths, GQA, speculative s_q,
varlen), and argument errors."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fp4attn
from fp4attn import DecodePlan, PagedKVCache, append_kv, decode

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _tokens(n, kv_heads, d, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, kv_heads, d, generator=g) * 3).to(dtype)


def _e2m1_rne(y):
    """y (float32) rounded to E2M1, ties to the even code, saturating at 6 (float64 values)."""
    a = y.double().abs()
    dist = (a.unsqueeze(-1) - E2M1).abs()
    best = dist.min(-1, keepdim=True).values
    even = 2 - torch.arange(8) % 2  # prefer the even code of a tie
    idx = ((dist == best).int() * even).argmax(-1)
    return E2M1[idx] * torch.sign(y.double())


def _nvfp4_ref(x, s_enc):
    """Per token row, blocks of 16: E4M3 scale (amax / 6) * s_enc, codes e2m1(x * s_enc / scale).
    Returns (e2m1 values, scale values, decoded values) in float32 for x float32 [..., d]."""
    s_enc = torch.tensor(s_enc, dtype=torch.float32)
    blocks = x.float().reshape(*x.shape[:-1], -1, 16)
    amax = blocks.abs().amax(-1)
    sf = (amax / 6) * s_enc
    scale = sf.clamp(max=448).to(torch.float8_e4m3fn).float()
    inv = torch.where(scale > 0, s_enc / scale, torch.zeros_like(scale))
    codes = _e2m1_rne(blocks * inv.unsqueeze(-1)).float()
    decoded = (codes * scale.unsqueeze(-1)) / s_enc
    return codes.reshape(x.shape), scale, decoded.reshape(x.shape)


def _unpack_e2m1(packed):
    """uint8 [..., d / 2] -> E2M1 values float32 [..., d], element 2j in the low nibble."""
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    sign = 1 - 2 * (nib >> 3).double()
    return (E2M1[nib & 7] * sign).float()


def _slots_of(cache, pages, n):
    """Slots of tokens 0..n of a sequence whose pages are `pages`."""
    return [pages[j // cache.page_size] * cache.page_size + j % cache.page_size for j in range(n)]


@pytest.mark.parametrize("rows", [1, 40])
def test_nvfp4_append_equals_independent_codec(rows):
    cache = PagedKVCache.empty(8, 16, 2, 64, k_global=300.0, v_global=150.0)
    k, v = _tokens(rows, 2, 64, 1), _tokens(rows, 2, 64, 2)
    slots = torch.randperm(8 * 16, generator=torch.Generator().manual_seed(3))[:rows]
    append_kv(cache, k, v, slots.int())
    page, off = slots // 16, slots % 16
    assert cache.k_global.item() == 300.0 and cache.v_global.item() == 150.0  # supplied: kept
    for data, scales, x, s_enc in (
        (cache.k_data, cache.k_scales, k, 300.0),
        (cache.v_data, cache.v_scales, v, 150.0),
    ):
        codes, scale, decoded = _nvfp4_ref(x, s_enc)
        assert torch.equal(_unpack_e2m1(data[page, off]), codes)
        assert torch.equal(scales[page, off].float(), scale)
        assert (scale > 0).all() and scale.max() <= 448
    # dequantize returns the codec values of every cached token (one sequence over all pages).
    tables = torch.arange(8, dtype=torch.int32)[None]
    kd, vd = cache.dequantize(tables, torch.tensor([128], dtype=torch.int32))
    assert kd.shape == (1, 128, 2, 64) and kd.dtype == torch.float32
    assert torch.equal(kd[0, slots], _nvfp4_ref(k, 300.0)[2])
    assert torch.equal(vd[0, slots], _nvfp4_ref(v, 150.0)[2])
    untouched = torch.ones(128, dtype=torch.bool)
    untouched[slots] = False
    assert torch.all(kd[0, untouched] == 0) and torch.all(
        cache.k_data.flatten(0, 1)[untouched] == 0
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_append_within_e4m3_rounding(dtype):
    cache = PagedKVCache.empty(4, 16, 2, 128, format="fp8", k_global=0.04, v_global=0.1)
    assert cache.k_data.dtype == torch.float8_e4m3fn and cache.k_scales is None
    k, v = _tokens(30, 2, 128, 4, dtype), _tokens(30, 2, 128, 5, dtype)
    slots = torch.arange(30, dtype=torch.int32) + 17
    append_kv(cache, k, v, slots)
    tables = torch.arange(4, dtype=torch.int32)[None]
    kd, vd = cache.dequantize(tables, torch.tensor([64], dtype=torch.int32))
    for data, out, x, scale in ((cache.k_data, kd, k, 0.04), (cache.v_data, vd, v, 0.1)):
        s = torch.tensor(scale, dtype=torch.float32)
        inv = torch.tensor(1.0, dtype=torch.float32) / s
        codes = (x.float() * inv).clamp(-448, 448).to(torch.float8_e4m3fn)
        stored = data.flatten(0, 1)[17:47]
        assert torch.equal(stored.view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(out[0, 17:47], codes.float() * s)
        assert (x.float().abs() / s).max() < 448  # no saturation here
        # E4M3 keeps 3 mantissa bits: half an ulp is 2^-4 relative (2^-10 * scale subnormal).
        err = (out[0, 17:47].double() - x.double()).abs()
        assert torch.all(err <= x.double().abs() * 2**-4 + scale * 2**-10)
        assert torch.all(out[0, :17] == 0) and torch.all(out[0, 47:] == 0)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_first_append_calibrates_globals_and_skips_negative_slots(fmt):
    cache = PagedKVCache.empty(2, 16, 2, 64, format=fmt)
    assert cache.k_global.item() == 0 and cache.v_global.item() == 0
    k, v = _tokens(6, 2, 64, 6), _tokens(6, 2, 64, 7)
    k[2] = 1e4  # skipped tokens neither land in the cache nor count for the calibration
    v[2] = -1e4
    k[4, 1, 3] = float("nan")  # a non-finite value does not pin the scale either
    slots = torch.tensor([5, 0, -1, 9, 31, 16], dtype=torch.int64)  # int64, as vLLM's
    append_kv(cache, k, v, slots)
    written = slots >= 0
    top = 2688.0 if fmt == "nvfp4" else 448.0
    for g, x in ((cache.k_global, k), (cache.v_global, v)):
        xs = x[written].float()
        amax = xs[torch.isfinite(xs)].abs().max()
        want = (top / amax) if fmt == "nvfp4" else (amax / torch.tensor(top))
        assert g.dtype == torch.float32 and g.item() == want.float().item()
    first = (cache.k_global.clone(), cache.v_global.clone())
    tables = torch.tensor([[0, 1]], dtype=torch.int32)
    kd, _ = cache.dequantize(tables, torch.tensor([32], dtype=torch.int32))
    filled = {5, 0, 9, 31, 16}
    for j in range(32):
        assert bool(torch.all(kd[0, j] == 0)) == (j not in filled), f"slot {j}"
    assert torch.isnan(kd[0, 31, 1]).any()  # the NaN token's block (or value) carries the NaN
    # A second append keeps the calibrated globals, even with larger values.
    append_kv(cache, k[:1] * 100, v[:1] * 100, torch.tensor([1], dtype=torch.int32))
    assert torch.equal(cache.k_global, first[0]) and torch.equal(cache.v_global, first[1])


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_append_of_zeros_leaves_globals_uncalibrated(fmt):
    cache = PagedKVCache.empty(2, 16, 2, 64, format=fmt)
    zeros = torch.zeros(3, 2, 64, dtype=torch.bfloat16)
    zeros[1, 0, 5] = float("inf")  # non-finite values do not calibrate either
    append_kv(cache, zeros, zeros, torch.tensor([0, 1, 2], dtype=torch.int32))
    assert cache.k_global.item() == 0 and cache.v_global.item() == 0
    # A cache whose globals are still 0 decodes to zeros (NaN where NaN), no error.
    q = torch.randn(1, 1, 4, 64, dtype=torch.bfloat16)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    o = decode(q, cache, tables, torch.tensor([1], dtype=torch.int32))
    assert torch.all(o == 0)
    kd, _ = cache.dequantize(tables, lens)
    assert torch.all((kd == 0) | torch.isnan(kd)) and torch.isnan(kd[0, 1, 0]).any()
    # The next append with data calibrates, as a single append of that data would.
    k, v = _tokens(5, 2, 64, 8), _tokens(5, 2, 64, 9)
    slots = torch.arange(5, dtype=torch.int32) + 3
    append_kv(cache, k, v, slots)
    once = PagedKVCache.empty(2, 16, 2, 64, format=fmt)
    append_kv(once, k, v, slots)
    assert cache.k_global.item() > 0 and cache.v_global.item() > 0
    assert torch.equal(cache.k_global, once.k_global) and torch.equal(cache.v_global, once.v_global)
    kd, _ = cache.dequantize(tables, torch.tensor([8], dtype=torch.int32))
    kd_once, _ = once.dequantize(tables, torch.tensor([8], dtype=torch.int32))
    assert torch.equal(kd[0, 3:], kd_once[0, 3:]) and torch.all(kd[0, 0] == 0)


def _build(fmt, page_size, lens, kv_heads, d, seed, extra_pages=3):
    """A cache holding sequences of `lens` tokens on shuffled pages, appended in one shuffled call
    with padding slots; returns cache, block_tables (padded with -1), seq_lens."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [math.ceil(n / page_size) for n in lens]
    total_pages = sum(n_pages) + extra_pages
    perm = torch.randperm(total_pages, generator=g).tolist()
    cache = PagedKVCache.empty(total_pages, page_size, kv_heads, d, format=fmt)
    tables = torch.full((len(lens), max(n_pages)), -1, dtype=torch.int32)
    slots = []
    at = 0
    for b, n in enumerate(lens):
        pages = perm[at : at + n_pages[b]]
        at += n_pages[b]
        tables[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots += _slots_of(cache, pages, n)
    slots += [-1, -1]
    order = torch.randperm(len(slots), generator=g)
    slot_mapping = torch.tensor(slots, dtype=torch.int32)[order]
    k, v = _tokens(len(slots), kv_heads, d, seed + 1), _tokens(len(slots), kv_heads, d, seed + 2)
    append_kv(cache, k, v, slot_mapping)
    return cache, tables, torch.tensor(lens, dtype=torch.int32)


def _reference(q_seq, k_seq, v_seq, causal, scale):
    """float64 attention of q [s_q, h, d] over k, v [L, kv_heads, d]; rows without visible keys
    give o = 0, lse = +inf. Returns o [s_q, h, d], lse [h, s_q]."""
    s_q, h, d = q_seq.shape
    length, kv_heads = k_seq.shape[0], k_seq.shape[1]
    qd = q_seq.double().transpose(0, 1)
    kd = k_seq.double().transpose(0, 1).repeat_interleave(h // kv_heads, dim=0)
    vd = v_seq.double().transpose(0, 1).repeat_interleave(h // kv_heads, dim=0)
    s = qd @ kd.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(s_q).unsqueeze(1)
        j = torch.arange(length).unsqueeze(0)
        s = s.masked_fill(j > i + length - s_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isinf(lse).unsqueeze(-1), 0.0, torch.exp(s - lse.unsqueeze(-1)))
    o = (p @ vd).transpose(0, 1)
    return o, lse.masked_fill(torch.isinf(lse), float("inf"))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("s_q", [1, 3])
def test_decode_matches_float64_attention_on_dequantized_cache(fmt, page_size, s_q):
    lens = [1, 37, 130, 5]
    cache, tables, seq_lens = _build(fmt, page_size, lens, 2, 64, seed=page_size + s_q)
    q = torch.randn(len(lens), s_q, 8, 64, generator=torch.Generator().manual_seed(9))
    o, lse = decode(q, cache, tables, seq_lens, return_lse=True)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (len(lens), 8, s_q) and lse.dtype == torch.float32
    kd, vd = cache.dequantize(tables, seq_lens)
    for b, n in enumerate(lens):
        ref_o, ref_lse = _reference(q[b], kd[b, :n], vd[b, :n], True, 1 / 8)
        torch.testing.assert_close(o[b], ref_o.float(), rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(lse[b], ref_lse.float(), rtol=2e-6, atol=2e-6)
    if s_q == 3:  # seq_len 1 with 3 queries: the first two see no key
        assert torch.all(o[0, :2] == 0) and torch.all(torch.isinf(lse[0, :, :2]))
    # The quantized cache is close to the tokens it stores.
    err = fp4attn.decode(q, cache, tables, seq_lens, causal=False, softmax_scale=0.1)
    assert torch.isfinite(err).all()


def test_decode_non_causal_gqa_bfloat16_and_varlen_equals_batched():
    lens = [20, 64, 3]
    cache, tables, seq_lens = _build("nvfp4", 16, lens, 2, 128, seed=11)
    q = torch.randn(3, 2, 8, 128, generator=torch.Generator().manual_seed(12))
    o, lse = decode(q, cache, tables, seq_lens, causal=False, softmax_scale=0.07, return_lse=True)
    kd, vd = cache.dequantize(tables, seq_lens)
    for b, n in enumerate(lens):
        ref_o, ref_lse = _reference(q[b], kd[b, :n], vd[b, :n], False, 0.07)
        torch.testing.assert_close(o[b], ref_o.float(), rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(lse[b], ref_lse.float(), rtol=2e-6, atol=2e-6)
    # Varlen with every sequence holding 2 queries is the batched call, bit for bit.
    cu = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
    ov, lv = decode(q.flatten(0, 1), cache, tables, seq_lens, 0.07, False, cu, return_lse=True)
    assert torch.equal(ov, o.flatten(0, 1))
    assert torch.equal(lv, lse.permute(1, 0, 2).flatten(1, 2))
    ob = decode(q.bfloat16(), cache, tables, seq_lens, causal=False, softmax_scale=0.07)
    assert ob.dtype == torch.bfloat16
    torch.testing.assert_close(ob.float(), o, rtol=2e-2, atol=2e-2)


def test_varlen_decode_ragged_queries():
    lens = [9, 1, 70, 33]
    len_q = [3, 1, 0, 5]
    cache, tables, seq_lens = _build("fp8", 64, lens, 2, 64, seed=21)
    cu = torch.tensor([0, 3, 4, 4, 9], dtype=torch.int32)
    q = torch.randn(9, 8, 64, generator=torch.Generator().manual_seed(22))
    o, lse = decode(q, cache, tables, seq_lens, cu_seqlens_q=cu, return_lse=True)
    assert o.shape == q.shape and lse.shape == (8, 9)
    kd, vd = cache.dequantize(tables, seq_lens)
    for b, n in enumerate(lens):
        q0, q1 = int(cu[b]), int(cu[b + 1])
        if q1 == q0:
            continue
        ref_o, ref_lse = _reference(q[q0:q1], kd[b, :n], vd[b, :n], True, 1 / 8)
        torch.testing.assert_close(o[q0:q1], ref_o.float(), rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(lse[:, q0:q1], ref_lse.float(), rtol=2e-6, atol=2e-6)
    assert len_q == [int(cu[i + 1] - cu[i]) for i in range(4)]


def _small():
    cache = PagedKVCache.empty(2, 16, 2, 64)
    tables = torch.tensor([[0, 1]], dtype=torch.int32)
    seq_lens = torch.tensor([4], dtype=torch.int32)
    append_kv(cache, *(_tokens(4, 2, 64, s) for s in (1, 2)), torch.arange(4, dtype=torch.int32))
    return cache, tables, seq_lens


def test_bad_arguments_name_the_argument():
    cache, tables, seq_lens = _small()
    q = torch.randn(1, 1, 8, 64)
    with pytest.raises(TypeError, match="^block_tables: expected int32"):
        decode(q, cache, tables.long(), seq_lens)
    with pytest.raises(TypeError, match="^seq_lens: expected int32"):
        decode(q, cache, tables, seq_lens.long())
    with pytest.raises(ValueError, match="^seq_lens: 2 sequences"):
        decode(q, cache, tables, torch.tensor([4, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="^q: head_dim 128 differs"):
        decode(torch.randn(1, 1, 8, 128), cache, tables, seq_lens)
    with pytest.raises(ValueError, match="^q: number of heads 3"):
        decode(torch.randn(1, 1, 3, 64), cache, tables, seq_lens)
    with pytest.raises(ValueError, match="^q: batch 2"):
        decode(torch.randn(2, 1, 8, 64), cache, tables, seq_lens)
    with pytest.raises(ValueError, match="^q: rank 3 .* needs cu_seqlens_q"):
        decode(q[0], cache, tables, seq_lens)
    with pytest.raises(ValueError, match="^cu_seqlens_q: expected batch \\+ 1 = 2"):
        decode(q[0], cache, tables, seq_lens, cu_seqlens_q=torch.tensor([0], dtype=torch.int32))
    with pytest.raises(TypeError, match="^q: dtype torch.int32"):
        decode(q.int(), cache, tables, seq_lens)
    with pytest.raises(TypeError, match="^cache: expected a fp4attn.PagedKVCache"):
        decode(q, {"k_data": cache.k_data}, tables, seq_lens)
    with pytest.raises(ValueError, match="^softmax_scale"):
        decode(q, cache, tables, seq_lens, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="seq_lens"):  # more tokens than the table's pages hold
        decode(q, cache, tables, torch.tensor([33], dtype=torch.int32))
    k = _tokens(2, 2, 64, 3)
    with pytest.raises(TypeError, match="^k: dtype torch.float64 is not supported on CPU"):
        append_kv(cache, k.double(), k.double(), torch.tensor([5, 6], dtype=torch.int32))
    with pytest.raises(TypeError, match="^v: dtype torch.float16 differs"):
        append_kv(cache, k, k.half(), torch.tensor([5, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="^k: expected shape \\(2, 2, 64\\)"):
        append_kv(cache, k[:, :1], k[:, :1], torch.tensor([5, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="^slot_mapping: 3 slots for 2 tokens"):
        append_kv(cache, k, k, torch.tensor([5, 6, 7], dtype=torch.int32))
    with pytest.raises(TypeError, match="^slot_mapping: expected int32"):
        append_kv(cache, k, k, torch.tensor([5.0, 6.0]))
    with pytest.raises(ValueError, match="slot_mapping"):  # past the 32 slots
        append_kv(cache, k, k, torch.tensor([5, 32], dtype=torch.int32))
    with pytest.raises(ValueError, match="slot_mapping"):  # one slot twice in a call
        append_kv(cache, k, k, torch.tensor([7, 7], dtype=torch.int32))
    # int64 slots are read at full width: past the cache (also beyond int32) is an error...
    for bad in (32, 2**32 + 5, 2**63 - 1):
        with pytest.raises(ValueError, match=f"^slot_mapping\\[1\\]: slot {bad} is out of range"):
            append_kv(cache, k, k, torch.tensor([5, bad], dtype=torch.int64))
    # ...and any negative slot is padding, never wrapped onto a real slot (-2**32 + 3 -> 3).
    fresh = PagedKVCache.empty(2, 16, 2, 64, format="fp8", k_global=0.05, v_global=0.05)
    append_kv(fresh, k, k, torch.tensor([-(2**32) + 3, -(2**63)], dtype=torch.int64))
    assert int(fresh.k_data.view(torch.uint8).count_nonzero()) == 0
    with pytest.raises(ValueError, match="^head_dim: head_dim 96 is not supported"):
        PagedKVCache.empty(2, 16, 2, 96)
    with pytest.raises(ValueError, match="^format: expected one of nvfp4, fp8"):
        PagedKVCache.empty(2, 16, 2, 64, format="int4")
    with pytest.raises(ValueError, match="^page_size: expected a value >= 1"):
        PagedKVCache.empty(2, 0, 2, 64)
    with pytest.raises(ValueError, match="^k_global: expected 0"):
        PagedKVCache.empty(2, 16, 2, 64, k_global=-1.0)
    fp8 = PagedKVCache.empty(2, 16, 2, 64, format="fp8")
    fp8.k_scales = cache.k_scales
    with pytest.raises(ValueError, match="^cache.k_scales: must be None for an fp8 cache"):
        decode(q, fp8, tables, seq_lens)
    bad = PagedKVCache.empty(2, 16, 2, 64)
    bad.v_scales = bad.v_scales[:, :, :1]
    with pytest.raises(ValueError, match="^cache.v_scales: expected shape \\(2, 16, 2, 4\\)"):
        append_kv(bad, k, k, torch.tensor([0, 1], dtype=torch.int32))
    bad = PagedKVCache.empty(2, 16, 2, 64)
    bad.k_global = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(ValueError, match="^cache.k_global: expected float32"):
        append_kv(bad, k, k, torch.tensor([0, 1], dtype=torch.int32))


def test_cache_layout_of_empty():
    c = PagedKVCache.empty(3, 64, 4, 128, k_global=2.0)
    assert c.k_data.shape == (3, 64, 4, 64) and c.k_data.dtype == torch.uint8
    assert c.v_scales.shape == (3, 64, 4, 8) and c.v_scales.dtype == torch.float8_e4m3fn
    assert c.k_global.shape == (1,) and c.k_global.dtype == torch.float32
    assert c.k_global.item() == 2.0 and c.v_global.item() == 0.0
    assert (c.num_pages, c.page_size, c.kv_heads, c.head_dim) == (3, 64, 4, 128)
    f = PagedKVCache.empty(3, 16, 1, 64, format="fp8")
    assert f.k_data.shape == (3, 16, 1, 64) and f.head_dim == 64 and f.v_scales is None


def _to_cuda(cache):
    return PagedKVCache(
        *(
            None if t is None else t.cuda()
            for t in (cache.k_data, cache.v_data, cache.k_scales, cache.v_scales)
        ),
        cache.k_global.cuda(),
        cache.v_global.cuda(),
        cache.format,
        errors=torch.zeros(1, dtype=torch.int32, device="cuda"),
    )


@pytest.mark.skipif(not fp4attn.cuda_available(), reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("s_q, d", [(1, 128), (3, 128), (4, 128), (1, 64), (4, 64)])
def test_cuda_decode_matches_the_golden_model(fmt, s_q, d):
    # The kernel's tolerance (docs/kernels/decode.md 7.4): P and O rounded to BF16,
    # 2^-7 * max|v| + 2^-7 * |o| per element; the LSE within 1e-3. s_q 4: speculative decode.
    lens = [1, 37, 130, 5]
    cache, tables, seq_lens = _build(fmt, 16, lens, 2, d, seed=40 + s_q)
    q = torch.randn(len(lens), s_q, 8, d, generator=torch.Generator().manual_seed(41))
    q = q.bfloat16()
    want_o, want_lse = decode(q.float(), cache, tables, seq_lens, return_lse=True)
    got_o, got_lse = decode(
        q.cuda(), _to_cuda(cache), tables.cuda(), seq_lens.cuda(), return_lse=True
    )
    assert got_o.dtype == torch.bfloat16 and got_o.device.type == "cuda"
    kd, vd = cache.dequantize(tables, seq_lens)
    vmax = float(vd.abs().max())
    err = (got_o.float().cpu() - want_o).abs()
    assert float((err - 2**-7 * (vmax + want_o.abs())).max()) <= 0
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isinf(got_lse.cpu()), ~finite)
    assert float((got_lse.cpu()[finite] - want_lse[finite]).abs().max()) <= 1e-3
    with pytest.raises(TypeError, match="^q: dtype torch.float32 is not supported on CUDA"):
        decode(q.float().cuda(), _to_cuda(cache), tables.cuda(), seq_lens.cuda())
    # A bad page id is not read: its sequence's rows are NaN, the others are untouched, the
    # cache's error flag says so (no host sync in decode); check_indices finds it on the host.
    bad = tables.clone()
    bad[1, 0] = 999
    dev = _to_cuda(cache)
    o_bad = decode(q.cuda(), dev, bad.cuda(), seq_lens.cuda())
    assert torch.isnan(o_bad[1].float()).all()
    assert torch.equal(o_bad[[0, 2, 3]], got_o[[0, 2, 3]])
    with pytest.raises(ValueError, match="block_tables: a page id outside"):
        dev.check_errors()
    dev.check_errors()  # cleared
    plan = DecodePlan(dev, q.cuda(), bad.cuda())
    with pytest.raises(ValueError, match=r"^block_tables\[1, 0\]: page id 999"):
        plan.check_indices(q.cuda(), dev, bad.cuda(), seq_lens.cuda())
    plan.check_indices(q.cuda(), dev, tables.cuda(), seq_lens.cuda())


def test_docs_example_runs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    m = re.search(r"<!-- paged-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert m, "docs/python.md: the block after <!-- paged-example --> is missing"
    out = subprocess.run(
        [sys.executable, "-c", m.group(1)], capture_output=True, text=True, check=True
    ).stdout
    assert "torch.Size([2, 1, 8, 128]) torch.Size([2, 8, 1])" in out


def test_paged_ops_are_custom_ops():
    """append_kv and decode run through the torch.library ops of fp4attn._ops (mutation of the
    cache declared, fake kernels), so torch.compile traces decode (uint8 codes: opcheck compares
    no float8 on CPU)."""
    import dataclasses

    from fp4attn import _ops

    cache = PagedKVCache.empty(4, 16, 2, 64, format="nvfp4")
    cache = dataclasses.replace(
        cache, k_scales=cache.k_scales.view(torch.uint8), v_scales=cache.v_scales.view(torch.uint8)
    )
    k, v = _tokens(20, 2, 64, seed=1), _tokens(20, 2, 64, seed=2)
    slots = torch.arange(20, dtype=torch.int32)
    torch.library.opcheck(
        _ops.paged_kv_append, (k, v, slots, *cache._tensors(), cache.rule, cache.errors)
    )
    append_kv(cache, k, v, slots)
    tables, seq_lens = (
        torch.tensor([[2, 0]], dtype=torch.int32),
        torch.tensor([20], dtype=torch.int32),
    )
    q = _tokens(3, 4, 64, seed=3).unsqueeze(0)  # [1, s_q = 3, heads 4, 64]
    args = (q, None, *cache._tensors(), tables, seq_lens, 0.0, True)
    for return_lse in (False, True):
        torch.library.opcheck(_ops.paged_decode, (*args, return_lse, None, 1, cache.errors))
    o, lse = torch.empty_like(q), torch.empty(1, 4, 3)
    torch.library.opcheck(_ops.paged_decode_into, (*args, o, lse, None, 1, cache.errors))
    compiled = torch.compile(
        lambda q: decode(q, cache, tables, seq_lens, return_lse=True), backend="eager",
        fullgraph=True,
    )  # fmt: skip
    for got, want in zip(compiled(q), decode(q, cache, tables, seq_lens, return_lse=True)):
        assert torch.equal(got, want)


@pytest.mark.skipif(not fp4attn.cuda_available(), reason="needs a CUDA GPU and a CUDA build")
def test_cuda_int64_slots_are_read_at_full_width():
    # On CUDA nothing syncs to check slot values: a negative int64 slot (any magnitude) is
    # padding, skipped silently; one past the cache (beyond int32 too) is skipped and flagged;
    # nothing wraps onto slot 0 or 3.
    cache = _to_cuda(PagedKVCache.empty(2, 16, 2, 64, format="fp8", k_global=0.05, v_global=0.05))
    k = torch.randn(3, 2, 64, dtype=torch.bfloat16, device="cuda")
    append_kv(cache, k, k, torch.tensor([-(2**32), -(2**32) + 3, -1], device="cuda"))
    cache.check_errors()  # padding is no error
    append_kv(cache, k[:1], k[:1], torch.tensor([2**32], device="cuda"))
    with pytest.raises(ValueError, match="slot_mapping: a slot >= num_pages"):
        cache.check_errors()
    assert int(cache.k_data.view(torch.uint8).count_nonzero()) == 0
    append_kv(cache, k[:1], k[:1], torch.tensor([3], device="cuda"))  # a real slot is written
    assert int(cache.k_data[0, 3].view(torch.uint8).count_nonzero()) > 0


def test_check_cache_sees_a_field_assigned_after_a_check():
    """check_cache skips a cache whose fields are the objects it last checked; a field assigned
    anew is checked again."""
    from fp4attn.paged import check_cache

    cache = fp4attn.PagedKVCache.empty(4, 16, 2, 64)
    assert check_cache(cache) is cache
    assert check_cache(cache) is cache  # the memo path
    good = cache.k_data
    cache.k_data = good.view(torch.int8)
    with pytest.raises(TypeError, match="cache.k_data: expected dtype uint8"):
        check_cache(cache)
    cache.k_data = good
    cache.format = "fp8"
    with pytest.raises((TypeError, ValueError), match="cache"):
        check_cache(cache)
