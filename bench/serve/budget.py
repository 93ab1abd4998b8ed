"""The KV memory budget: the bytes of a page in each format, the sequences of a context a budget
holds, and the NVFP4 pools of the budget allocated and decoded over to verify them."""

from __future__ import annotations

import time

import torch

from .common import PAGE, cleanup, first_line


def page_bytes(fmt, kv, d):
    """Bytes of one page (16 tokens, K and V) of one layer."""
    if fmt == "nvfp4":
        return PAGE * kv * (d // 2 + d // 16) * 2
    return PAGE * kv * d * 2 * 2


def sequences_at_budget(budget, layers, kv, d, context):
    pages = -(-context // PAGE)
    return {
        "fp4attn-nvfp4": budget // (layers * pages * page_bytes("nvfp4", kv, d)),
        "bf16-paged": budget // (layers * pages * page_bytes("bf16", kv, d)),
        # one row of `context` tokens reserved per sequence
        "sdpa-contiguous": budget // (layers * context * kv * d * 2 * 2),
    }


def verify_budget(model, budget, context):
    """Allocates the NVFP4 pools the budget buys (all layers), fills them with random codes,
    and decodes once per layer over as many sequences of `context` as they hold."""
    dev, kv, d, layers = model.device, model.kv_heads, model.head_dim, model.n_layers
    per_layer = budget // layers // page_bytes("nvfp4", kv, d)
    pages_per_seq = -(-context // PAGE)
    n = per_layer // pages_per_seq
    out = {"context": context, "format": "nvfp4", "pages_per_layer": per_layer,
           "sequences": n}  # fmt: skip
    caches = []
    try:
        import fp4attn

        for _ in range(layers):
            c = fp4attn.PagedKVCache.empty(per_layer, PAGE, kv, d, format="nvfp4", device=dev,
                                           k_global=1.0, v_global=1.0)  # fmt: skip
            for t in (c.k_data, c.v_data):
                t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, device=dev))
            for t in (c.k_scales, c.v_scales):
                t.copy_((0.5 + 1.5 * torch.rand(t.shape, device=dev)).to(t.dtype))
            caches.append(c)
        out["bytes_allocated"] = sum(
            t.numel() * t.element_size()
            for c in caches
            for t in (c.k_data, c.v_data, c.k_scales, c.v_scales)
        )
        perm = torch.randperm(per_layer, device=dev)[: n * pages_per_seq]
        tables = perm.view(n, pages_per_seq).to(torch.int32).contiguous()
        lens = torch.full((n,), context, dtype=torch.int32, device=dev)
        q = torch.randn(n, 1, model.heads, d, dtype=torch.bfloat16, device=dev)
        o = torch.empty_like(q)
        plan = fp4attn.DecodePlan(caches[0], q, tables, softmax_scale=d**-0.5)
        finite = True
        t0 = time.perf_counter()
        for c in caches:
            plan.run(q, c, tables, lens, out=o)
            finite = finite and bool(torch.isfinite(o.float()).all().item())
        out["decode_all_layers_s"] = time.perf_counter() - t0
        for c in caches:
            c.check_errors()
        out["decode_ok"] = finite
    except Exception as e:
        out["error"] = first_line(e)
        out["decode_ok"] = False
    finally:
        caches = None
        cleanup(dev)
    return out
