#!/usr/bin/env python3
"""Context-parallel attention on the GPUs of one host: fp4attn's ring (fp4attn.distributed,
packed FP4 / FP8 messages) against a BF16 ring built from torch SDPA's cuDNN backend (the same
ring schedule and zig-zag sharding, BF16 K/V messages, the same float32 LSE merge), in one run.

    python3 bench/cp_bench.py --out bench/results/cp.json [--quick] [--recipes nvfp4,nvfp4-all]
                              [--time-budget 220] [--revision SHA] [--command "..."]

Spawns N = torch.cuda.device_count() NCCL processes (one GPU each, NVLink multicast off). Shape:
b = 1, h = h_kv = 16, d = 128, BF16 inputs, BSHD. Points:
* strong scaling: global s in {64k, 128k, 256k} (quick: 64k, 128k), on 1 GPU (rank 0 alone)
  and on N GPUs; efficiency = T1 / (N * TN) of the same implementation;
* weak scaling: s per GPU in {32k, 64k} (quick: 64k), on 1 GPU (s) and on N GPUs (N * s);
  efficiency = N * T1 / TN (attention work per GPU grows N-fold when s does: TN = N * T1 is
  ideal);
each non-causal and causal (zig-zag shards). Timing: CUDA events around one whole call (quantize,
ring, merge) on every rank after a barrier, the slowest rank's time, median of `reps` after
`warmup` calls. Records: DESIGN.md's schema plus gpus, scaling, s_q = the global length,
efficiency, speedup = BF16 ring ms / ours, bytes per message, and rel_l2 of our output against
the BF16 ring's (a sanity check, not an accuracy figure). Points past --time-budget are skipped
(recorded with "error") so a slow machine still writes its JSON.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the record's head and file

B, H, D = 1, 16, 128
PEER = "ring-sdpa-cudnn-bf16"
K = 1024


def points(quick: bool):
    strong = [64 * K, 128 * K] if quick else [64 * K, 128 * K, 256 * K]
    weak = [64 * K] if quick else [32 * K, 64 * K]
    return strong, weak


# ---- the BF16 ring: torch SDPA (cuDNN) on BF16 K/V blocks -------------------------------------


BACKEND = {"name": "cudnn"}  # falls back to flash (recorded) if cuDNN refuses a shape


def _sdpa_cudnn(q, k, v, causal, scale):
    """(o BSHD, lse [b, h, s] natural log) of BHSD q, k, v through the cuDNN backend."""
    b, h, s, _ = q.shape
    if BACKEND["name"] == "cudnn":
        try:
            out = torch.ops.aten._scaled_dot_product_cudnn_attention(
                q, k, v, None, True, 0.0, causal, False, scale=scale
            )
            return out[0].transpose(1, 2), out[1].float().reshape(b, h, s)
        except RuntimeError:
            traceback.print_exc()
            BACKEND["name"] = "flash"
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                             scale=scale)
    return out[0].transpose(1, 2), out[1].float().reshape(b, h, s)


def bf16_ring(q, k, v, causal, zigzag, group=None):
    """Ring attention over BF16 shards (BSHD) with fp4attn.distributed's schedule and merge."""
    import torch.distributed as dist
    from fp4attn import distributed as fd

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    b, s_l, h, d = q.shape
    scale = 1 / math.sqrt(d)
    lens = [s_l] * world  # the bench's shards have equal lengths
    first = s_l // 2 if zigzag else s_l
    qt = q.transpose(1, 2)
    o = torch.zeros((b, s_l, h, d), dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, s_l), -torch.inf, dtype=torch.float32, device=q.device)

    def attend(rows, kv, keys, masked):
        kk, vv = kv
        if keys is not None:
            kk, vv = kk[:, :, :keys], vv[:, :, :keys]
        o_p, lse_p = _sdpa_cudnn(qt[:, :, rows:], kk, vv, masked, scale)
        fd.merge_partials(o[:, rows:], lse[:, :, rows:], o_p, lse_p)

    peers = [(rank + 1) % world, (rank - 1) % world]
    if group is not None:
        peers = [dist.get_global_rank(group, p) for p in peers]
    kv = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    buf, src = torch.stack(kv), rank
    for step in range(world):
        reqs = []
        if step + 1 < world:
            recv = torch.empty_like(buf)
            reqs = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, buf, peers[0], group),
                dist.P2POp(dist.irecv, recv, peers[1], group),
            ])
        if not causal:
            attend(0, kv, None, False)
        elif src == rank:
            attend(0, kv, None, True)
        elif not zigzag:
            if src < rank:
                attend(0, kv, None, False)
        elif src < rank:
            attend(0, kv, first, False)
        else:
            attend(first, kv, None, False)
        for r in reqs:
            r.wait()
        if reqs:
            src = (src - 1) % world
            buf = recv
            kv = (recv[0], recv[1])
    return o.to(q.dtype), lse, 2 * b * h * lens[0] * d * 2


# ---- timing -----------------------------------------------------------------------------------


def _time(fn, group, warmup, reps):
    """Median / min / max ms of fn() over reps (the slowest rank each rep), after warmup."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        t = torch.tensor([start.elapsed_time(end)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        times.append(float(t))
    return statistics.median(times), min(times), max(times)


def _measure(impl, recipe, s, causal, group, world, rank, args):
    """One point on `group` (world ranks): returns a dict (on every member)."""
    import torch.distributed as dist
    from fp4attn import distributed as fd

    g = torch.Generator(device="cuda").manual_seed(s + int(causal))
    shape = (B, s, H, D)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    zigzag = causal
    local = [fd.shard(t, group=group, zigzag=zigzag) for t in (q, k, v)]
    del q, k, v
    out = {}
    if impl == "fp4attn":
        stats = {}

        def fn():
            return fd.ring_attn_func(*local, causal=causal, recipe=recipe, zigzag=zigzag,
                                     group=group, stats=stats)
    else:
        def fn():
            return bf16_ring(*local, causal, zigzag, group=group)

    ms, ms_min, ms_max = _time(fn, group, args.warmup, args.reps)
    o = fn()
    if impl == "fp4attn":
        out["bytes_per_message"] = stats["bytes_sent"] // max(stats["messages"], 1)
        out["bf16_bytes_per_message"] = stats["bf16_bytes"] // max(stats["messages"], 1)
        out["wire"] = stats.get("wire")
        out["o"] = o
    else:
        out["bytes_per_message"] = o[2] if world > 1 else 0
        out["backend"] = BACKEND["name"]
        out["o"] = o[0]
    flops = 4 * B * H * D * s * s * (0.5 if causal else 1.0)
    out.update(ms=round(ms, 4), ms_min=round(ms_min, 4), ms_max=round(ms_max, 4),
               reps=args.reps, tflops=round(flops / ms / 1e9, 2))
    del local
    return out


def _rel_l2(a, b, group):
    import torch.distributed as dist

    t = torch.stack([(a.float() - b.float()).pow(2).sum(), b.float().pow(2).sum()])
    dist.all_reduce(t, group=group)
    return float((t[0] / t[1]).sqrt())


def _worker(rank, world, store, args, outpath):
    from fp4attn import distributed as fd

    os.environ.update(fd.NO_MULTICAST_ENV)
    torch.cuda.set_device(rank)
    import torch.distributed as dist

    fd.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=120),
                          device_id=torch.device("cuda", rank))
    solo = dist.new_group([0])  # T1: rank 0 alone (a collective call on every rank)
    t0 = time.monotonic()
    strong, weak = points(args.quick)
    gpu_counts = sorted({1, world})
    wanted = set()  # (gpus, s_global, causal)
    for causal in (False, True):
        for s in strong:
            wanted |= {(n, s, causal) for n in gpu_counts}
        for s in weak:
            wanted |= {(1, s, causal), (world, world * s, causal)}
    results = {}  # (impl, recipe, gpus, s, causal) -> dict
    for n, s, causal in sorted(wanted):
        impls = [("bf16", PEER)] + [("fp4attn", r) for r in args.recipes]
        for impl, recipe in impls:
            key = (impl, recipe, n, s, causal)
            flag = torch.tensor([time.monotonic() - t0 > args.time_budget], device="cuda")
            dist.broadcast(flag, 0)
            if bool(flag):
                results[key] = {"error": "skipped: past --time-budget"}
                continue
            member = rank < n
            group = None if n == world else solo
            if member:
                try:
                    results[key] = _measure(impl, recipe, s, causal, group, n, rank, args)
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    traceback.print_exc()
                    results[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            dist.barrier()
        # Sanity: our output against the BF16 ring's (same inputs).
        if rank < n:
            group = None if n == world else solo
            ref = results.get(("bf16", PEER, n, s, causal), {}).get("o")
            for r in args.recipes:
                ours = results.get(("fp4attn", r, n, s, causal), {})
                if ref is not None and "o" in ours:
                    ours["rel_l2_vs_bf16_ring"] = round(_rel_l2(ours["o"], ref, group), 5)
            for key, res in results.items():
                if key[2:] == (n, s, causal):
                    res.pop("o", None)
        dist.barrier()
        torch.cuda.empty_cache()
    if rank == 0:
        torch.save(results, outpath)
    dist.barrier()
    dist.destroy_process_group()


def _records(results, world, args):
    strong, weak = points(args.quick)
    recs = []

    def rec(recipe, n, s, causal, scaling, base_s):
        ours = results.get(("fp4attn", recipe, n, s, causal), {"error": "not measured"})
        peer = results.get(("bf16", PEER, n, s, causal), {"error": "not measured"})
        t1 = results.get(("fp4attn", recipe, 1, base_s, causal), {})
        p1 = results.get(("bf16", PEER, 1, base_s, causal), {})
        r = {"case": f"{scaling}-s{s // K}k-{'causal' if causal else 'noncausal'}-{n}gpu",
             "recipe": recipe, "b": B, "h": H, "h_kv": H, "s_q": s, "s_k": s, "d": D,
             "causal": causal, "gpus": n, "scaling": scaling, "s_per_gpu": s // n,
             "sharding": "zigzag" if causal else "contiguous"}
        for f in ("ms", "ms_min", "ms_max", "reps", "tflops", "bytes_per_message",
                  "bf16_bytes_per_message", "wire", "rel_l2_vs_bf16_ring", "error"):
            if f in ours:
                r[f] = ours[f]
        r["peer"] = PEER
        if "ms" in peer:
            r["peer_ms"] = peer["ms"]
            r["peer_tflops"] = peer["tflops"]
            r["peer_bytes_per_message"] = peer["bytes_per_message"]
            r["peer_backend"] = peer.get("backend")
            if "ms" in ours:
                r["speedup"] = round(peer["ms"] / ours["ms"], 4)
        elif "error" in peer:
            r["peer_error"] = peer["error"]
        if n > 1 and r.get("bytes_per_message"):
            r["message_ratio_vs_bf16"] = round(ours["bf16_bytes_per_message"] /
                                               ours["bytes_per_message"], 4)
        if "ms" in ours and "ms" in t1:
            r["efficiency"] = round(t1["ms"] * (n if scaling == "weak" else 1) /
                                    ((n if scaling == "strong" else 1) * ours["ms"]), 4)
        if "ms" in peer and "ms" in p1:
            r["peer_efficiency"] = round(p1["ms"] * (n if scaling == "weak" else 1) /
                                         ((n if scaling == "strong" else 1) * peer["ms"]), 4)
        recs.append(r)

    for recipe in args.recipes:
        for causal in (False, True):
            for s in strong:
                for n in sorted({1, world}):
                    rec(recipe, n, s, causal, "strong", s)
            for s in weak:
                for n in sorted({1, world}):
                    rec(recipe, n, n * s, causal, "weak", s)
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/cp.json")
    ap.add_argument("--quick", action="store_true", help="fewer points and reps (~2 min on 2 GPUs)")
    ap.add_argument("--recipes", default="nvfp4,nvfp4-all")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds after which the remaining points are skipped")
    record.add_revision_flag(ap)
    ap.add_argument("--command", default=None)
    args = ap.parse_args()
    args.recipes = [r for r in args.recipes.split(",") if r]
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 5)
    world = torch.cuda.device_count()
    if world < 1:
        sys.exit("cp_bench: no CUDA device")
    from fp4attn import distributed as fd

    os.environ.update(fd.NO_MULTICAST_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        outpath = os.path.join(tmp, "results.pt")
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), args, outpath), nprocs=world)
        results = torch.load(outpath, weights_only=False)
    strong, weak = points(args.quick)
    doc = record.header("cp", record.revision(args.revision), torch.cuda.get_device_name(0),
                        args.command)
    doc |= {
        "gpus": world,
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(),
                     "nccl": str(torch.cuda.nccl.version())},
        "config": {
            "shape": f"b={B}, h=h_kv={H}, d={D}, BF16 BSHD inputs (torch.randn)",
            "strong_s": strong, "weak_s_per_gpu": weak, "recipes": args.recipes,
            "warmup": args.warmup, "reps": args.reps, "peer": PEER,
            "timing": "CUDA events around one whole call per rank after a barrier; the slowest "
                      "rank; median of reps",
            "efficiency": "strong: T1 / (N * TN); weak: N * T1 / TN (T1: rank 0 alone)",
            "causal_sharding": "zig-zag", "noncausal_sharding": "contiguous",
            "env": dict(fd.NO_MULTICAST_ENV),
        },
        "records": _records(results, world, args),
    }
    record.write_json(doc, args.out)
    for r in doc["records"]:
        print(f"{r['case']:32s} {r['recipe']:10s} ms {r.get('ms', '-')!s:>9} peer "
              f"{r.get('peer_ms', '-')!s:>9} speedup {r.get('speedup', '-')!s:>7} eff "
              f"{r.get('efficiency', '-')!s:>6} msg {r.get('bytes_per_message', '-')} "
              f"{r.get('error', '')}")
    print(f"cp_bench: wrote {args.out} ({len(doc['records'])} records)")


if __name__ == "__main__":
    main()
