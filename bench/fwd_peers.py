#!/usr/bin/env python3
"""The peers of the fwd suite, measured with the device's PyTorch in the same gpu-check call.

torch SDPA forward in BF16 with the cuDNN backend ("sdpa-cudnn-bf16", issue 4's peer) and the
flash backend (FA2, "sdpa-flash-bf16") on every point of the fwd grid (16k tokens in total,
hidden 2048, d in {64, 128}, s in {1k .. 16k}, causal off and on; --quick: d=128, s in {4k,
16k}), timed as fp4attn_bench fwd times the engine: CUDA events around each call after warm-up,
at least --min-reps calls and --min-time-ms in all, median (min and max kept). The SM clock is
measured right after each point with a clock64 spin (torch.cuda._sleep) between two events.
Ceilings come from bench/peers.py: BF16 and FP8 (torch._scaled_mm) GEMM at 8192^3 and the copy.
Also the peers' accuracy against float64 (computed on the GPU) at FA3's comparison shape
(b=8, h=16, s=2048, d=128, N(0, 1) inputs rounded to BF16).

    python3 bench/fwd_peers.py OUT.json [--quick] [--revision SHA] [--min-reps N] [--min-time-ms T]

bench/fwd_record.py merges OUT.json with fp4attn_bench's fwd JSON into bench/results/fwd.json.
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # bench/peers.py: backends, ceilings, clocks, the part's header
import record  # --revision
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel


def grid(quick, dims=None, seqlens=None):
    """(d, s, causal) in fp4attn_bench fwd's order (bench/cpp/fwd_grid.cc)."""
    dims = dims or ((128,) if quick else (64, 128))
    seqlens = seqlens or ((4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384))
    return [(d, s, causal) for d in dims for s in seqlens for causal in (False, True)]


def case_name(d, s, causal):
    return f"d{d}-s{s}-{'causal' if causal else 'noncausal'}"


def time_stats(fn, warmup, min_reps, min_time_ms, max_reps=2000, setup=None):
    """Median, min, max milliseconds and the call count: each call between two CUDA events, at
    least min_reps calls and min_time_ms in all (from a 3-call estimate), after `warmup` calls.
    With `setup`, each call is fn(setup()), setup's work enqueued before the start event and so
    not timed (bench/bwd_peers.py: a new forward before each timed backward)."""

    def call():
        return fn() if setup is None else fn(setup())

    for _ in range(warmup):
        call()

    def run(n):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, stop in events:
            arg = None if setup is None else setup()
            start.record()
            fn() if setup is None else fn(arg)
            stop.record()
        torch.cuda.synchronize()
        return sorted(start.elapsed_time(stop) for start, stop in events)

    est = run(3)[1]
    reps = max(min_reps, math.ceil(min_time_ms / est) if est > 0 else min_reps)
    times = run(min(max(reps, 1), max(max_reps, min_reps)))
    n = len(times)
    median = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    return median, times[0], times[-1], n


def sm_clock_mhz(cycles=20_000_000):
    """The SM clock measured on the device: a clock64 spin of `cycles` between two events."""
    if not hasattr(torch.cuda, "_sleep"):  # a private helper: absent in some builds
        return None
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    ms = start.elapsed_time(stop)
    return cycles / (ms * 1e3) if ms > 0 else None


def measure_point(peer, d, s, causal, args):
    h = peers.HIDDEN // d
    b = max(1, peers.TOKENS // s)
    rec = {"case": case_name(d, s, causal), "recipe": "bf16", "peer": peer, "b": b, "h": h,
           "h_kv": h, "s_q": s, "s_k": s, "d": d, "causal": causal}
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    try:
        with sdpa_kernel([peers.BACKENDS[peer]]):
            med, lo, hi, n = time_stats(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                args.warmup, args.min_reps, args.min_time_ms)
        rec.update(ms=med, ms_min=lo, ms_max=hi, reps=n,
                   tflops=peers.attention_flops(b, h, s, d, causal) / med / 1e9,
                   sm_mhz=sm_clock_mhz())
    except RuntimeError as e:  # a backend that does not take this shape
        rec["error"] = (str(e).splitlines() or ["RuntimeError"])[0][:200]
    return rec


def error_stats(test, ref):
    """cos and rel-L2 of test against ref (float64), as src/harness/metrics.h defines them."""
    t, r = test.double().flatten(), ref.double().flatten()
    cos = (t @ r / (t.norm() * r.norm())).item()
    return {"cos": cos, "rel_l2": ((t - r).norm() / r.norm()).item(),
            "max_abs": (t - r).abs().max().item()}


def peer_accuracy(seed=0):
    """Each peer's output at FA3's comparison shape against a float64 softmax(QK^T/sqrt(d))V of
    the same BF16 inputs (all 128 heads: cheap in float64 on the GPU)."""
    b, h, s, d = 8, 16, 2048, 128
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(torch.bfloat16)
               for _ in range(3))
    ref = torch.empty(b, h, s, d, device="cuda", dtype=torch.float64)
    for i in range(b):  # one batch at a time: the float64 scores of all 8 take 4 GiB
        sc = (q[i].double() @ k[i].double().transpose(-1, -2)) / math.sqrt(d)
        ref[i] = torch.softmax(sc, dim=-1) @ v[i].double()
    out = []
    for peer, backend in peers.BACKENDS.items():
        rec = {"case": f"fa3-d{d}-s{s}-noncausal", "recipe": "bf16", "peer": peer, "b": b,
               "h": h, "h_kv": h, "s_q": s, "s_k": s, "d": d, "causal": False,
               "reference": "float64 on the GPU, every head", "inputs": "torch.randn -> BF16"}
        try:
            with sdpa_kernel([backend]):
                rec.update(error_stats(F.scaled_dot_product_attention(q, k, v), ref))
        except RuntimeError as e:
            rec["error"] = (str(e).splitlines() or ["RuntimeError"])[0][:200]
        out.append(rec)
    del ref
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="d=128, s in {4k, 16k}, shorter timing")
    record.add_revision_flag(ap)
    ap.add_argument("--dims", type=lambda t: [int(x) for x in t.split(",")])
    ap.add_argument("--seqlens", type=lambda t: [int(x) for x in t.split(",")])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-reps", type=int, default=10)
    ap.add_argument("--min-time-ms", type=float, default=None, help="default 200, quick 50")
    ap.add_argument("--ceiling-reps", type=int, default=None, help="default 20, quick 10")
    ap.add_argument("--no-accuracy", action="store_true", help="skip the FA3-shape accuracy")
    args = ap.parse_args()
    if args.min_time_ms is None:
        args.min_time_ms = 50.0 if args.quick else 200.0
    if not torch.cuda.is_available():
        sys.exit("fwd_peers.py: no CUDA device")

    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(torch.cuda.current_device())
    doc = peers.part_doc("fwd", args.revision, {
        "warmup": args.warmup, "min_reps": args.min_reps, "min_time_ms": args.min_time_ms,
        "layout": "BHSD contiguous, torch.randn"})
    ceilings = peers.measure_ceilings(args.ceiling_reps or (10 if args.quick else 20))
    doc["ceilings"] = ceilings
    print(f"fwd peers on {dev.name}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in ceilings.items() if isinstance(v, float)), flush=True)

    records = []
    print(f"{'case':<22} {'peer':<16} {'ms':>9} {'TFLOP/s':>8} {'MHz':>6}", flush=True)
    for d, s, causal in grid(args.quick, args.dims, args.seqlens):
        for peer in peers.BACKENDS:
            r = measure_point(peer, d, s, causal, args)
            records.append(r)
            if "error" in r:
                print(f"{r['case']:<22} {peer:<16} error: {r['error']}", flush=True)
            else:
                print(f"{r['case']:<22} {peer:<16} {r['ms']:9.4f} {r['tflops']:8.1f} "
                      f"{r['sm_mhz'] or 0:6.0f}", flush=True)
        torch.cuda.empty_cache()
    doc["records"] = records
    if not args.no_accuracy:
        doc["accuracy"] = peer_accuracy()
        for a in doc["accuracy"]:
            print(f"{a['case']:<22} {a['peer']:<16} " +
                  (f"cos {a['cos']:.7f} rel_l2 {a['rel_l2']:.5f}" if "cos" in a
                   else f"error: {a['error']}"), flush=True)
    peers.write_part(doc, args.out)


if __name__ == "__main__":
    main()
