"""Indexing past 2^31 on the GPU (issue 26): a forward and its quantizers over tensors of more than
2^31 elements, and a paged KV cache whose pages lie past 2^31 bytes of its pool. Each checks that
the entries far into the tensors equal the same computation on a small tensor (the recipes are
batch invariant and a cache's pages are independent), bit for bit. Runs on a Hopper with about
40 GB free; skipped elsewhere."""

import pytest
import torch

import fp4attn

pytestmark = pytest.mark.usefixtures("hopper")

# 2056 * 1024 * 8 * 128 = 2.16e9 elements per tensor (> 2^31), 4.3 GB in BF16.
B, S, H, D = 2056, 1024, 8, 128


@pytest.fixture(scope="module")
def big_qkv():
    assert B * S * H * D > 2**31
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)
    )
    yield q, k, v
    del q, k, v
    torch.cuda.empty_cache()


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_forward_past_2_31_elements_equals_the_small_batch(big_qkv, recipe):
    q, k, v = big_qkv
    o = fp4attn.attn_func(q, k, v, causal=True, recipe=recipe)
    for i in (0, B // 2, B - 1):  # the last entry starts past 2^31 elements
        one = fp4attn.attn_func(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], causal=True, recipe=recipe
        )
        assert torch.equal(o[i : i + 1], one), f"batch entry {i} differs ({recipe})"
    assert not torch.isnan(o[-1]).any()


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_quantizers_past_2_31_elements_equal_the_small_batch(big_qkv, recipe):
    q, k, v = big_qkv
    ops = fp4attn.quantize_qkv(q, k, v, recipe=recipe)
    last = fp4attn.quantize_qkv(q[-1:], k[-1:], v[-1:], recipe=recipe)
    for name in fp4attn.QuantizedQKV.TENSORS:
        big, small = getattr(ops, name)[-1:], getattr(last, name)
        assert torch.equal(
            big.view(torch.uint8) if big.dtype != torch.float32 else big,
            small.view(torch.uint8) if small.dtype != torch.float32 else small,
        ), name
    del ops


@pytest.mark.parametrize("fmt, bytes_per_token", [("nvfp4", 8 * 128 // 2), ("fp8", 8 * 128)])
def test_decode_pages_past_2_31_bytes_equal_the_same_pages_low(fmt, bytes_per_token):
    page, h_kv, length, batch = 16, 8, 4096, 2
    pages_needed = length // page
    low_pages = 2**31 // (page * bytes_per_token)  # pages before byte 2^31 of k_data
    num_pages = low_pages + 2 * pages_needed
    cache = fp4attn.PagedKVCache.empty(num_pages, page, h_kv, D, format=fmt, device="cuda")
    assert cache.k_data.numel() * cache.k_data.element_size() > 2**31
    g = torch.Generator(device="cuda").manual_seed(1)
    k, v = (
        torch.randn(length, h_kv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(2)
    )
    low = torch.arange(pages_needed, device="cuda", dtype=torch.int32)
    high = num_pages - 1 - torch.arange(pages_needed, device="cuda", dtype=torch.int32)  # the top
    # The same tokens into low pages and into pages past 2^31 bytes; calibrate the globals first
    # with the low copy so that both copies are quantized with the same scales.
    tokens = torch.arange(length, device="cuda")
    for table in (low, high):
        slots = table[tokens // page].long() * page + tokens % page
        fp4attn.append_kv(cache, k, v, slots)
    assert int(high.min()) * page * bytes_per_token >= 2**31
    for t in (cache.k_data, cache.v_data):  # the two copies hold the same bytes
        assert torch.equal(t[low.long()].view(torch.uint8), t[high.long()].view(torch.uint8))
    q = torch.randn(batch, 1, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
    tables = torch.stack([low, high])
    lens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    out = fp4attn.decode(q[:1].expand(batch, -1, -1, -1).contiguous(), cache, tables, lens)
    cache.check_errors()
    assert torch.equal(out[0], out[1]), f"decode over pages past 2^31 bytes differs ({fmt})"
    assert not torch.isnan(out).any()
    del cache
    torch.cuda.empty_cache()
