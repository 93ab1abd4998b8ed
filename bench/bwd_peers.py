#!/usr/bin/env python3
"""The bwd record (issue 8's speed target): fp4attn forward + backward through PyTorch autograd
against torch SDPA BF16 (cuDNN, the issue's peer; flash = FA2 beside it), in the same run.

Grid: d = 128, causal, s in {4k, 8k, 16k} (--seqlens), 16k tokens in total (b = 16384 / s), hidden
2048 (h = h_kv = 16). Per point, recipe (--recipes, default nvfp4,fp8) and peer:

* fwd+bwd: o = fp4attn.attn_func(q, k, v, causal=True, recipe=R) on BF16 BSHD q/k/v that require
  grad, then o.backward(dO), between two CUDA events (the quantization of Q/K/V in the forward,
  and of Q/K/V/dO again in the backward, included); the grads are set to None before each call,
  outside the events. The peer: F.scaled_dot_product_attention(..., is_causal=True) on BHSD
  tensors under sdpa_kernel(backend), then o.backward(dO).
* bwd: a new forward before each sample, outside the events; torch.autograd.backward(o, dO) alone
  between them. The peer: the same with SDPA.
* fwd+bwd-noquant: qkv = fp4attn.quantize_qkv(q, k, v, recipe=R) on the leaves (which require
  grad, so qkv keeps them as its sources) outside the events, grads set to None there too; then
  o = fp4attn.attn_quantized(qkv, causal=True) and o.backward(dO) between them. The backward runs
  on the saved operands (no requantization of Q/K/V); the quantization of dO inside the backward
  stays included. Its speedup is against the peer's fwd+bwd. Each fwd+bwd record also carries
  quant_qkv_ms, quantize_qkv timed alone (the forward's share of quantization).
* --smooth-k: attn_func(..., smooth_k=True) for fwd+bwd, bwd and the accuracy (K smoothing,
  docs/python.md); fwd+bwd-noquant is then skipped (attn_quantized has no smooth_k), and the
  header's `skipped` says so.

FLOPs: forward 4 b h s_q s_k d, halved for causal; fwd+bwd = 3.5x, bwd = 2.5x. Timing as
bench/fwd_peers.py's (warm-up, a 3-call estimate, at least --min-reps calls and --min-time-ms in
all, median, min, max, clock64-spin SM clock after each). speedup = peer_ms / median_ms against
the peer measured on the same point in the same run; fwd+bwd records against cuDNN also carry
target_speedup (1.3) and meets_target. Gradient accuracy: dq, dk, dv (and o) of every recipe and
peer against float64 math attention with autograd, on the device, at b=1, h=4, s=1024, d=128,
causal, q/k/v/dO N(0, 1) rounded to BF16 (issue 8: cos >= 0.99 for nvfp4).

    python3 bench/bwd_peers.py OUT.json [--recipes nvfp4,fp8] [--seqlens 4096,8192,16384]
        [--quick] [--revision SHA] [--min-reps N] [--min-time-ms T] [--smooth-k]

--device cpu runs the same code on fp4attn's CPU golden model against SDPA's math backend
(peer "sdpa-math-bf16"): timings meaningless, the JSON complete (CI's smoke test, e.g.
--device cpu --tokens 64 --seqlens 64 --quick --acc-seqlen 64).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_peers  # time_stats, sm_clock_mhz, error_stats
import grad_audit  # exact_attention: float64 causal softmax attention, BSHD
import peers  # backends, clocks, the part's header
import record  # revision, command line
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn

HEAD_DIM = 128
TARGET_SPEEDUP = 1.3  # issue 8: fwd+bwd (quantization included) >= 1.3x SDPA cuDNN BF16
TARGET_COS = 0.99  # issue 8: gradient cosine against float64, nvfp4
KINDS = ("fwd+bwd", "fwd+bwd-noquant", "bwd")
PEER_KIND = {"fwd+bwd": "fwd+bwd", "fwd+bwd-noquant": "fwd+bwd", "bwd": "bwd"}  # compared with
SKIPPED_SMOOTH_K = {
    "kind": "fwd+bwd-noquant",
    "reason": "--smooth-k: fp4attn.attn_quantized (operands quantized once, outside the timing) "
    "has no smooth_k; fwd+bwd records carry quant_qkv_ms (quantize_qkv alone) instead.",
}
CPU_PEERS = {"sdpa-math-bf16": SDPBackend.MATH}


def fwd_flops(b, h, s_q, s_k, d, causal):
    """4 b h s_q s_k d, halved for causal, as an int (so rounding in the JSON cannot touch it)."""
    return 4 * b * h * s_q * s_k * d // (2 if causal else 1)


def kind_flops(kind, fwd):
    return {"fwd+bwd": fwd * 7 // 2, "fwd+bwd-noquant": fwd * 7 // 2, "bwd": fwd * 5 // 2}[kind]


def case_name(kind, d, s, causal):
    return f"{kind}-{fwd_peers.case_name(d, s, causal)}"


def timed(device, fn, args, setup=None):
    """(median, min, max, reps) in ms: fwd_peers.time_stats on CUDA; on the CPU (smoke runs only)
    a few perf_counter samples."""
    if device.type == "cuda":
        return fwd_peers.time_stats(fn, args.warmup, args.min_reps, args.min_time_ms, setup=setup)
    for _ in range(min(args.warmup, 1)):
        fn() if setup is None else fn(setup())
    times = []
    for _ in range(max(1, min(args.min_reps, 3))):
        arg = None if setup is None else setup()
        t0 = time.perf_counter()
        fn() if setup is None else fn(arg)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return statistics.median(times), times[0], times[-1], len(times)


def error_text(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def measure(device, leaves, do, attention, args, noquant=None):
    """{kind: stats dict or {"error": ...}} for fwd+bwd and bwd of attention(*leaves), and with
    noquant (recipe) fwd+bwd-noquant: quantize_qkv(*leaves) untimed, attn_quantized timed."""

    def clear():
        for t in leaves:
            t.grad = None

    def fwd_bwd(_):
        attention(*leaves).backward(do)

    def forward():
        clear()
        return attention(*leaves)

    def quantize():
        clear()
        return fp4attn.quantize_qkv(*leaves, recipe=noquant)

    def noquant_fwd_bwd(qkv):
        fp4attn.attn_quantized(qkv, causal=True, d_source=args.d_source).backward(do)

    runs = [("fwd+bwd", fwd_bwd, clear)]
    if noquant is not None:
        runs.append(("fwd+bwd-noquant", noquant_fwd_bwd, quantize))
    runs.append(("bwd", lambda o: torch.autograd.backward(o, do), forward))
    out = {}
    for kind, fn, setup in runs:
        try:
            med, lo, hi, n = timed(device, fn, args, setup=setup)
            out[kind] = {
                "median_ms": med,
                "min_ms": lo,
                "max_ms": hi,
                "reps": n,
                "sm_mhz": fwd_peers.sm_clock_mhz() if device.type == "cuda" else None,
            }
        except (RuntimeError, NotImplementedError, ValueError) as e:
            out[kind] = {"error": error_text(e)}
        clear()
    return out


def point_shape(s, args):
    h = peers.HIDDEN // HEAD_DIM
    return max(1, args.tokens // s), h, s, HEAD_DIM


def make_inputs(device, b, h, s, d, seed):
    """BSHD leaves for fp4attn, BHSD leaves (the same values) for SDPA, dO in both layouts."""
    gen = torch.Generator(device=device).manual_seed(seed)
    base = [
        torch.randn(b, s, h, d, device=device, generator=gen).to(torch.bfloat16) for _ in range(4)
    ]
    ours = [t.clone().requires_grad_() for t in base[:3]]
    theirs = [t.transpose(1, 2).contiguous().requires_grad_() for t in base[:3]]
    return ours, base[3], theirs, base[3].transpose(1, 2).contiguous()


def run_point(device, s, recipes, peer_backends, args):
    """The peers' records and ours (one per recipe x kind x peer) at one grid point."""
    b, h, s, d = point_shape(s, args)
    geom = {"b": b, "s_q": s, "s_k": s, "h": h, "h_kv": h, "d": d, "causal": True}
    fwd = fwd_flops(b, h, s, s, d, True)
    ours_in, do, theirs_in, do_t = make_inputs(device, b, h, s, d, seed=s)

    peer_recs = []
    for peer, backend in peer_backends.items():

        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        for kind, m in measure(device, theirs_in, do_t, sdpa, args).items():
            rec = {
                "case": case_name(kind, d, s, True),
                "kind": kind,
                "recipe": "bf16",
                "peer": peer,
                **geom,
                "flops": kind_flops(kind, fwd),
                **m,
            }
            if "median_ms" in m:
                rec["tflops"] = rec["flops"] / m["median_ms"] / 1e9
            peer_recs.append(rec)

    records = []
    for recipe in recipes:

        def ours(q, k, v, recipe=recipe):
            return fp4attn.attn_func(
                q, k, v, causal=True, recipe=recipe, d_source=args.d_source,
                smooth_k=args.smooth_k,
            )  # fmt: skip

        noquant = None if args.smooth_k else recipe
        results = measure(device, ours_in, do, ours, args, noquant=noquant)
        quant = None
        try:
            qkv = [t.detach() for t in ours_in]
            quant = timed(
                device, lambda qkv=qkv, r=recipe: fp4attn.quantize_qkv(*qkv, recipe=r), args
            )[0]
        except (RuntimeError, NotImplementedError, ValueError):
            pass
        for kind in KINDS:
            if kind not in results:  # skipped (--smooth-k)
                continue
            m = results[kind]
            base = {
                "case": case_name(kind, d, s, True),
                "kind": kind,
                "recipe": recipe,
                **geom,
                "flops": kind_flops(kind, fwd),
                **m,
            }
            if "median_ms" in m:
                base["tflops"] = base["flops"] / m["median_ms"] / 1e9
            if kind == "fwd+bwd":
                base["quant_qkv_ms"] = quant
            for p in peer_recs:
                if p["kind"] != PEER_KIND[kind]:
                    continue
                rec = dict(
                    base, peer=p["peer"], peer_ms=p.get("median_ms"), peer_tflops=p.get("tflops")
                )
                ok = "median_ms" in m and rec["peer_ms"]
                rec["speedup"] = rec["peer_ms"] / m["median_ms"] if ok else None
                if kind == "fwd+bwd" and p["peer"] == next(iter(peer_backends)):
                    rec["target_speedup"] = TARGET_SPEEDUP
                    rec["meets_target"] = bool(ok and rec["speedup"] >= TARGET_SPEEDUP)
                if "error" in p:
                    rec["peer_error"] = p["error"]
                records.append(rec)
    del ours_in, do, theirs_in, do_t
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return peer_recs, records


def gradient_accuracy(
    device, recipes, peer_backends, s, seed=0, d_source="forward-o", smooth_k=False
):
    """dq, dk, dv and o of each recipe and peer against float64 math attention (autograd) on
    `device`, b=1, h=4, s, d=128, causal, q/k/v/dO N(0, 1) rounded to BF16."""
    b, h, d = 1, 4, HEAD_DIM
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (
        torch.randn(b, s, h, d, device=device, generator=gen).to(torch.bfloat16) for _ in range(4)
    )
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref = grad_audit.exact_attention(*ref_leaves)
    ref = [o_ref.detach()] + list(torch.autograd.grad(o_ref, ref_leaves, do.double()))
    head = {
        "case": f"grad-b{b}-h{h}-s{s}-d{d}-causal",
        "b": b,
        "s_q": s,
        "s_k": s,
        "h": h,
        "h_kv": h,
        "d": d,
        "causal": True,
        "reference": f"float64 math attention with autograd, on {device.type}",
        "inputs": "q, k, v, dO torch.randn -> BF16",
    }

    def record(rec, attention, bhsd):
        try:
            leaves = [
                (t.transpose(1, 2).contiguous() if bhsd else t.clone()).requires_grad_()
                for t in (q, k, v)
            ]
            o = attention(*leaves)
            g = torch.autograd.grad(o, leaves, do.transpose(1, 2) if bhsd else do)
            got = [t.transpose(1, 2) if bhsd else t for t in (o.detach(), *g)]
            for name, x, r in zip(("o", "dq", "dk", "dv"), got, ref):
                rec[name] = fwd_peers.error_stats(x, r)
            rec["min_grad_cos"] = min(rec[n]["cos"] for n in ("dq", "dk", "dv"))
            rec["max_grad_rel_l2"] = max(rec[n]["rel_l2"] for n in ("dq", "dk", "dv"))
        except (RuntimeError, NotImplementedError, ValueError) as e:
            rec["error"] = error_text(e)
        return rec

    out = []
    for recipe in recipes:
        rec = record(
            dict(head, recipe=recipe),
            lambda q, k, v, r=recipe: fp4attn.attn_func(
                q, k, v, causal=True, recipe=r, d_source=d_source, smooth_k=smooth_k
            ),
            bhsd=False,
        )
        if recipe == "nvfp4" and "min_grad_cos" in rec:
            rec["target_cos"] = TARGET_COS
            rec["meets_target"] = rec["min_grad_cos"] >= TARGET_COS
        out.append(rec)
    for peer, backend in peer_backends.items():

        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        out.append(record(dict(head, recipe="bf16", peer=peer), sdpa, bhsd=True))
    return out


def summarize(records, recipes, accuracy, main_peer, kinds=KINDS):
    """Per recipe and kind, against main_peer: points, errors, min and geomean speedup (and for
    fwd+bwd the points meeting the target); the recipe's smallest gradient cosine."""
    out = {}
    for recipe in recipes:
        entry = {}
        for kind in kinds:
            rs = [
                r
                for r in records
                if r["recipe"] == recipe and r["kind"] == kind and r["peer"] == main_peer
            ]
            sp = [r["speedup"] for r in rs if r.get("speedup")]
            e = {
                "points": len(rs),
                "errors": sum("error" in r or r.get("speedup") is None for r in rs),
                "min_speedup": min(sp) if sp else None,
                "geomean_speedup": math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None,
            }
            if kind == "fwd+bwd":
                e["target_speedup"] = TARGET_SPEEDUP
                e["meets_target"] = sum(bool(r.get("meets_target")) for r in rs)
            entry[kind] = e
        acc = [a for a in accuracy if a.get("recipe") == recipe and "peer" not in a]
        entry["grad_min_cos"] = acc[0].get("min_grad_cos") if acc else None
        out[recipe] = entry
    return out


def print_row(r):
    if "error" in r:
        print(f"{r['case']:<33} {r['recipe']:<9} {r['peer']:<16} error: {r['error']}", flush=True)
        return
    tail = ""
    if "speedup" in r:
        tail = f" {r['peer_ms'] or 0:9.3f} {r['speedup'] or 0:7.3f}"
    print(
        f"{r['case']:<33} {r['recipe']:<9} {r['peer']:<16} {r['median_ms']:9.3f} "
        f"{r['tflops']:8.1f}{tail}",
        flush=True,
    )


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def ints(text):
        return [int(x) for x in text.split(",") if x]

    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--recipes", default="nvfp4,fp8", help="comma-separated (default nvfp4,fp8)")
    ap.add_argument("--seqlens", type=ints, default=None, help="default 4096,8192,16384")
    ap.add_argument("--quick", action="store_true", help="s in {4k, 16k}, shorter timing")
    record.add_revision_flag(ap)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-reps", type=int, default=None, help="default 10, quick 5")
    ap.add_argument("--min-time-ms", type=float, default=None, help="default 200, quick 50")
    ap.add_argument("--no-flash", action="store_true", help="cuDNN only (no FA2 records)")
    ap.add_argument("--no-accuracy", action="store_true", help="skip the gradient accuracy")
    ap.add_argument("--acc-seqlen", type=int, default=1024, help="accuracy point's s (1024)")
    ap.add_argument("--tokens", type=int, default=peers.TOKENS, help="b = tokens / s (16384)")
    ap.add_argument(
        "--d-source",
        default="forward-o",
        choices=("forward-o", "high-precision-o"),
        help="the backward's D (docs/numerics.md §8); high-precision-o is the one to train with",
    )
    ap.add_argument(
        "--smooth-k",
        action="store_true",
        help="attn_func(..., smooth_k=True) (K smoothing); skips fwd+bwd-noquant",
    )
    ap.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: golden model vs SDPA math, a smoke run (timings meaningless)",
    )
    args = ap.parse_args(argv)
    args.recipes = [r for r in args.recipes.split(",") if r]
    for r in args.recipes:
        if r not in fp4attn.RECIPES:
            ap.error(f"--recipes: unknown recipe {r!r} (known: {', '.join(fp4attn.RECIPES)})")
    if args.seqlens is None:
        args.seqlens = [4096, 16384] if args.quick else [4096, 8192, 16384]
    if args.min_reps is None:
        args.min_reps = 5 if args.quick else 10
    if args.min_time_ms is None:
        args.min_time_ms = 50.0 if args.quick else 200.0
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bwd_peers.py: no CUDA device (--device cpu for a smoke run)")
    device = torch.device(args.device)
    if device.type == "cuda":
        peer_backends = dict(peers.BACKENDS)
        if args.no_flash:
            peer_backends.pop("sdpa-flash-bf16")
    else:
        peer_backends = dict(CPU_PEERS)
    main_peer = next(iter(peer_backends))
    torch.manual_seed(0)

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(fp4attn.__file__)))
    doc = peers.part_doc(
        "bwd",
        record.revision(args.revision, package_dir),
        {
            "warmup": args.warmup,
            "min_reps": args.min_reps,
            "min_time_ms": args.min_time_ms,
            "recipes": ",".join(args.recipes),
            "d_source": args.d_source,
            "smooth_k": args.smooth_k,
            "seqlens": args.seqlens,
            "tokens": args.tokens,
            "hidden": peers.HIDDEN,
            "torch_device": device.type,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "inputs": "q, k, v, dO torch.randn -> BF16, seeded per point; fp4attn BSHD, SDPA BHSD "
            "(the same values), both contiguous",
            "timing": "fwd+bwd: grads set to None outside the events, forward + o.backward(dO) "
            "between them; fwd+bwd-noquant: quantize_qkv outside the events, attn_quantized + "
            "o.backward(dO) (dO's quantization included) between them; bwd: a new forward "
            "outside the events, backward alone between them; median of the samples",
        },
        command=record.command_line(argv, __file__),
    )
    if device.type != "cuda":
        doc["device"] = "cpu"  # a CPU smoke run names the CPU, also on a machine with a GPU
    doc.pop("part")
    doc.update(
        {
            "fp4attn": {
                "version": fp4attn.__version__,
                "path": os.path.dirname(fp4attn.__file__),
                "cuda_available": fp4attn.cuda_available(),
            },
            "flops_convention": "forward 4 b h s_q s_k d (x0.5 causal); fwd+bwd 3.5x, bwd 2.5x",
            "peer": main_peer,
            "target": f"fwd+bwd (quantization included) >= {TARGET_SPEEDUP}x {main_peer}; "
            f"nvfp4 gradient cos >= {TARGET_COS}",
            "skipped": [SKIPPED_SMOOTH_K] if args.smooth_k else [],
            "complete": False,
            "sm_clock_mhz": None,
            "summary": {},
            "records": [],
            "peers": [],
            "accuracy": [],
        }
    )
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    kinds = tuple(k for k in KINDS if not (args.smooth_k and k == "fwd+bwd-noquant"))
    print(
        f"bwd on {name} (revision {doc['revision']}); "
        f"kinds: {', '.join(kinds)}" + (", smooth_k" if args.smooth_k else ""),
        flush=True,
    )
    print(
        f"{'case':<33} {'recipe':<9} {'peer':<16} {'ms':>9} {'TFLOP/s':>8} {'peer_ms':>9} "
        f"{'speedup':>7}",
        flush=True,
    )

    def finish(complete):
        clocks = [r["sm_mhz"] for r in doc["records"] + doc["peers"] if r.get("sm_mhz")]
        doc["sm_clock_mhz"] = statistics.median(clocks) if clocks else None
        doc["summary"] = summarize(doc["records"], args.recipes, doc["accuracy"], main_peer, kinds)
        doc["complete"] = complete
        peers.write_part(doc, args.out)

    for s in args.seqlens:
        peer_recs, records = run_point(device, s, args.recipes, peer_backends, args)
        for r in peer_recs + records:
            print_row(r)
        doc["peers"] += peer_recs
        doc["records"] += records
        finish(False)  # a stopped run keeps what it measured
    if not args.no_accuracy:
        doc["accuracy"] = gradient_accuracy(
            device,
            args.recipes,
            peer_backends,
            args.acc_seqlen,
            d_source=args.d_source,
            smooth_k=args.smooth_k,
        )
        for a in doc["accuracy"]:
            who = a.get("peer", a["recipe"])
            if "error" in a:
                print(f"{a['case']:<33} {who:<16} error: {a['error']}", flush=True)
            else:
                print(
                    f"{a['case']:<33} {who:<16} "
                    + "  ".join(
                        f"{n} cos {a[n]['cos']:.5f} rel_l2 {a[n]['rel_l2']:.4f}"
                        for n in ("dq", "dk", "dv")
                    ),
                    flush=True,
                )
    finish(True)
    for recipe, e in doc["summary"].items():
        fb = e["fwd+bwd"]
        nq = e.get("fwd+bwd-noquant")
        noquant = f"; fwd+bwd-noquant geomean {nq['geomean_speedup'] or 0:.3f}x" if nq else ""
        print(
            f"{recipe}: fwd+bwd vs {main_peer}: min {fb['min_speedup'] or 0:.3f}x, geomean "
            f"{fb['geomean_speedup'] or 0:.3f}x, {fb['meets_target']}/{fb['points']} points "
            f">= {TARGET_SPEEDUP}x{noquant}; bwd geomean {e['bwd']['geomean_speedup'] or 0:.3f}x; "
            f"gradient min cos {e['grad_min_cos']}",
            flush=True,
        )
    return doc


if __name__ == "__main__":
    main()
