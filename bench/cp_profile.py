#!/usr/bin/env python3
"""Where the time of fp4attn's ring goes on the GPUs of one host (a diagnostic beside cp_bench.py).

    python3 bench/cp_profile.py [--s 131072] [--recipe nvfp4] [--causal] [--trace DIR]

One NCCL process per GPU (multicast off), b = 1, h = 16, d = 128, BF16 inputs, the global
sequence s sharded as cp_bench shards it. Rank 0 prints, each the slowest rank's median of 3:
* p2p: one ring message's bytes sent to the next rank alone (GB/s);
* local attention: fp4attn.attn_func on this rank's own shard (the first ring step's work);
* ring, overlapped (the default: attend while the message travels) and not (overlap=False);
* with --trace DIR: a torch.profiler trace of one overlapped call per rank (chrome JSON), and rank
  0's GPU kernels with their start offsets and durations, to see whether the communication kernel
  and the attention kernel run side by side.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile

import torch
import torch.multiprocessing as mp

B, H, D = 1, 16, 128


def _timed(fn, reps=3):
    import torch.distributed as dist

    fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        t = torch.tensor([a.elapsed_time(b)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return statistics.median(times)


def _worker(rank, world, store, args):
    import fp4attn
    import torch.distributed as dist
    from fp4attn import distributed as fd

    os.environ.update(fd.NO_MULTICAST_ENV)
    torch.cuda.set_device(rank)
    fd.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=120),
                          device_id=torch.device("cuda", rank))
    g = torch.Generator(device="cuda").manual_seed(1)
    full = [torch.randn((B, args.s, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)]
    q, k, v = (fd.shard(t, zigzag=args.causal) for t in full)
    del full
    s_l = q.shape[1]
    msg = fd.message_bytes(args.recipe, B, H, s_l, D)["total"]
    send = torch.empty(msg, dtype=torch.uint8, device="cuda")
    recv = torch.empty_like(send)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def p2p():
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt),
                                         dist.P2POp(dist.irecv, recv, prv)]):
            r.wait()

    def local():
        fp4attn.attn_func(q, k, v, causal=args.causal, recipe=args.recipe)

    def ring(overlap):
        return lambda: fd.ring_attn_func(q, k, v, causal=args.causal, recipe=args.recipe,
                                         zigzag=args.causal, overlap=overlap)

    rows = []
    if world > 1:
        ms = _timed(p2p)
        rows.append((f"p2p {msg / 2**20:.0f} MiB", ms, f"{msg / ms / 1e6:.1f} GB/s"))
    rows.append(("local attention (one step)", _timed(local), ""))
    rows.append(("ring, overlapped", _timed(ring(True)), ""))
    rows.append(("ring, overlap=False", _timed(ring(False)), ""))
    if rank == 0:
        print(f"{world} GPU(s), s = {args.s}, {'causal' if args.causal else 'non-causal'}, "
              f"{args.recipe}, shard {s_l} tokens")
        for name, ms, extra in rows:
            print(f"  {name:32s} {ms:9.3f} ms  {extra}")
    if args.trace:
        from torch.profiler import ProfilerActivity, profile

        ring(True)()
        dist.barrier()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            ring(True)()
            torch.cuda.synchronize()
        os.makedirs(args.trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.trace, f"ring-rank{rank}.json"))
        if rank == 0:
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            kernels.sort(key=lambda e: e.time_range.start)
            t0 = kernels[0].time_range.start if kernels else 0
            print("  rank 0 GPU activity (start offset us, duration us, name):")
            for e in kernels:
                dur = e.time_range.end - e.time_range.start
                if dur >= 50:
                    print(f"    {e.time_range.start - t0:10.0f} {dur:10.0f}  {e.name[:90]}")
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--s", type=int, default=128 * 1024)
    ap.add_argument("--recipe", default="nvfp4")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--trace", default=None)
    args = ap.parse_args()
    world = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), args), nprocs=world)


if __name__ == "__main__":
    main()
