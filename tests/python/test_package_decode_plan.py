"""fp4attn.DecodePlan (plan once per batch shape, run once per layer): the same results as
decode(), shape and argument checks, and on CUDA capture in a CUDA graph, replayed with new page
tables and lengths bit for bit equal to eager runs, with bad indices flagged, never read."""

import pytest
import torch

import fp4attn
from fp4attn import DecodePlan, PagedKVCache, append_kv, decode

needs_cuda = pytest.mark.skipif(
    not fp4attn.cuda_available(), reason="needs a CUDA GPU and a CUDA build"
)


def _filled_cache(fmt, num_pages, page_size, kv_heads, d, device, seed=0):
    """A cache whose every slot holds a random token (so that any page table reads real data)."""
    cache = PagedKVCache.empty(num_pages, page_size, kv_heads, d, format=fmt, device=device)
    g = torch.Generator().manual_seed(seed)
    n = num_pages * page_size
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    k = torch.randn(n, kv_heads, d, generator=g).to(device, dtype)
    v = torch.randn(n, kv_heads, d, generator=g).to(device, dtype)
    append_kv(cache, k, v, torch.arange(n, dtype=torch.int32, device=device))
    return cache


def _tables(batch, max_pages, num_pages, lens, page_size, seed, device):
    """Random distinct page ids per row (pages in random order), -1 past each sequence."""
    g = torch.Generator().manual_seed(seed)
    t = torch.full((batch, max_pages), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        pages = torch.randperm(num_pages, generator=g)[: -(-n // page_size)]
        t[b, : len(pages)] = pages.to(torch.int32)
    return t.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def test_cpu_plan_run_equals_decode_and_checks_shapes():
    cache = _filled_cache("nvfp4", 12, 16, 2, 64, "cpu")
    tables, lens = _tables(3, 4, 12, [5, 64, 33], 16, seed=1, device="cpu")
    q = torch.randn(3, 2, 8, 64, generator=torch.Generator().manual_seed(2))
    plan = DecodePlan(cache, q, tables)
    assert plan.num_splits == 1 and plan.workspace is None  # CPU: the golden model
    o, lse = plan.run(q, cache, tables, lens, return_lse=True)
    want_o, want_lse = decode(q, cache, tables, lens, return_lse=True)
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)
    out, lse_out = torch.empty_like(q), torch.empty(3, 8, 2)
    got = plan.run(q, cache, tables, lens, out=out, lse=lse_out)
    assert got[0] is out and torch.equal(out, want_o) and torch.equal(lse_out, want_lse)
    with pytest.raises(ValueError, match=r"^q: shape \(3, 1, 8, 64\) differs from the plan's"):
        plan.run(q[:, :1], cache, tables, lens)
    with pytest.raises(ValueError, match="^block_tables: shape"):
        plan.run(q, cache, tables[:, :3], lens)
    fp8 = _filled_cache("fp8", 12, 16, 2, 64, "cpu")
    with pytest.raises(ValueError, match="^cache: .* differs from the plan's"):
        plan.run(q, fp8, tables, lens)
    with pytest.raises(ValueError, match="^out: expected float32 of shape"):
        plan.run(q, cache, tables, lens, out=torch.empty(3, 2, 8, 32))
    with pytest.raises(ValueError, match="^max_seq_len: expected a value in"):
        DecodePlan(cache, q, tables, max_seq_len=65)
    with pytest.raises(ValueError, match="^num_splits: expected a value >= 1"):
        DecodePlan(cache, q, tables, num_splits=0)
    bad = tables.clone()
    bad[2, 1] = 12
    with pytest.raises(ValueError, match=r"^block_tables\[2, 1\]: page id 12"):
        plan.check_indices(q, cache, bad, lens)
    with pytest.raises(ValueError, match=r"block_tables\[2, 1\]"):
        plan.run(q, cache, bad, lens)  # the golden model checks every call
    with pytest.raises(ValueError, match=r"^seq_lens\[0\]"):
        plan.check_indices(q, cache, tables, torch.tensor([65, 1, 1], dtype=torch.int32))


def test_cache_errors_flag_is_checked():
    cache = PagedKVCache.empty(2, 16, 1, 64)
    assert cache.errors.dtype == torch.int32 and cache.errors.shape == (1,)
    cache.check_errors()
    cache.errors[0] = 4 | 1
    with pytest.raises(ValueError, match="slot_mapping: .*; block_tables: a page id outside"):
        cache.check_errors()
    assert int(cache.errors[0]) == 0
    cache.errors = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cache.errors: expected int32 of shape \(1\)"):
        append_kv(
            cache, torch.zeros(1, 1, 64), torch.zeros(1, 1, 64), torch.zeros(1, dtype=torch.int32)
        )


def _graph_case(fmt, d, s_q, batch, max_pages, page_size=16, heads=8, kv_heads=2):
    num_pages = batch * max_pages + 8
    cache = _filled_cache(fmt, num_pages, page_size, kv_heads, d, "cuda", seed=3)
    q = torch.randn(batch, s_q, heads, d, device="cuda", dtype=torch.bfloat16)
    return cache, q, num_pages


@needs_cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize(
    "d, s_q, batch, max_pages", [(128, 1, 4, 64), (64, 4, 3, 40), (128, 1, 33, 8)]
)
def test_cuda_graph_replay_with_new_tables_equals_eager_bit_for_bit(fmt, d, s_q, batch, max_pages):
    cache, q, num_pages = _graph_case(fmt, d, s_q, batch, max_pages)
    cap = max_pages * 16
    lens_a = [cap - 3] + [max(s_q, (7 * b + 1) % cap) for b in range(1, batch)]
    lens_b = [max(s_q, (cap * (b + 1)) // (batch + 1)) for b in range(batch)]
    tables_a, seq_a = _tables(batch, max_pages, num_pages, lens_a, 16, seed=5, device="cuda")
    tables_b, seq_b = _tables(batch, max_pages, num_pages, lens_b, 16, seed=6, device="cuda")
    plan = DecodePlan(cache, q, tables_a)
    eager_a = plan.run(q, cache, tables_a, seq_a).clone()
    eager_b, lse_b = plan.run(q, cache, tables_b, seq_b, return_lse=True)
    assert torch.equal(eager_a, decode(q, cache, tables_a, seq_a))  # decode() = the same plan
    # Static buffers, captured once.
    st_q, st_t, st_l = q.clone(), tables_a.clone(), seq_a.clone()
    out, lse = torch.empty_like(q), torch.empty(batch, 8, s_q, device="cuda")
    plan.run(st_q, cache, st_t, st_l, out=out, lse=lse)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(st_q, cache, st_t, st_l, out=out, lse=lse)
    for tables, seq, want, want_lse in (
        (tables_b, seq_b, eager_b, lse_b),
        (tables_a, seq_a, eager_a, None),
    ):
        st_t.copy_(tables)
        st_l.copy_(seq)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
        if want_lse is not None:
            assert torch.equal(lse, want_lse)
    cache.check_errors()
    # A bad page id in the replayed table: its rows NaN, the rest as eager, the flag set.
    st_t.copy_(tables_b)
    st_l.copy_(seq_b)
    st_t[0, 0] = num_pages + 5
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[0].float()).all()
    assert torch.equal(out[1:].view(torch.int16), eager_b[1:].view(torch.int16))
    with pytest.raises(ValueError, match="block_tables: a page id outside"):
        cache.check_errors()
    st_l[1] = cap + 1  # a length past the table
    st_t.copy_(tables_b)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[1].float()).all()
    with pytest.raises(ValueError, match="seq_lens: a length outside"):
        cache.check_errors()


@needs_cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_cuda_graph_captures_append_and_decode_step(fmt):
    # One serving step in a graph: append this step's token (int64 slots with -1 padding, as
    # vLLM pads captured batches) and decode over it; equal to the same step run eagerly.
    batch, max_pages, heads, kv_heads, d = 4, 8, 8, 2, 128
    caches = [_filled_cache(fmt, 40, 16, kv_heads, d, "cuda", seed=s) for s in (7, 7)]
    lens = [17, 100, 1, 64]
    tables, seq = _tables(batch, max_pages, 40, lens, 16, seed=8, device="cuda")
    slot = torch.tensor(
        [int(tables[b, (n - 1) // 16]) * 16 + (n - 1) % 16 for b, n in enumerate(lens)],
        device="cuda",
    )
    slot[2] = -1  # padding
    k = torch.randn(batch, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, 1, heads, d, device="cuda", dtype=torch.bfloat16)
    plan = DecodePlan(caches[0], q, tables)
    append_kv(caches[0], k, v, slot)
    want = plan.run(q, caches[0], tables, seq)
    out = torch.empty_like(q)
    step = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step):
        append_kv(caches[1], k, v, slot)
        plan.run(q, caches[1], tables, seq, out=out)
    step.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(caches[1].k_data.view(torch.uint8), caches[0].k_data.view(torch.uint8))
    caches[1].check_errors()
