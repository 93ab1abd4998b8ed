#!/usr/bin/env python3
"""The "peers" suite: ceilings and BF16 attention peers measured with the device's PyTorch.

Ceilings: BF16 GEMM (cuBLAS) and FP8 E4M3 GEMM (torch._scaled_mm) at 8192^3, device copy
bandwidth (bytes read + written). Peers: torch SDPA forward with the cuDNN and flash backends,
BF16, on the grid of BACKGROUND.md section 4: 16k tokens in total (b = 16384 / s), hidden 2048
(h = 2048 / d), d in {64, 128}, s in {1k, 2k, 4k, 8k, 16k}, causal on and off. FLOPs are
4 * b * h * s * s * d, halved for causal (fwd+bwd: 3.5x forward).

Timing: CUDA events around each call after warm-up, median of the repetitions. Inputs are
N(0, 1) (never zeros). Writes the suite JSON (DESIGN.md schema) to the path given.

    python3 bench/peers.py OUT.json [--quick] [--bwd] [--revision SHA]
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the records' shared head and file writing
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "sdpa-cudnn-bf16": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash-bf16": SDPBackend.FLASH_ATTENTION,
}
TOKENS = 16384
HIDDEN = 2048


def time_ms(fn, warmup=5, reps=20):
    """Median milliseconds of fn() over `reps` calls, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in events)
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def read_clocks():
    """SM clock, its maximum, power and temperature from nvidia-smi (None when unavailable)."""
    if not torch.cuda.is_available():
        return None
    try:
        line = subprocess.run(
            ["nvidia-smi", "-i", str(torch.cuda.current_device()),
             "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None

    def num(s):
        try:
            return float(s)
        except ValueError:
            return None
    keys = ("sm_mhz", "max_sm_mhz", "power_w", "temp_c")
    return dict(zip(keys, (num(f.strip()) for f in line.split(","))))


def gemm_tflops(n, reps):
    """BF16 (cuBLAS) and FP8 E4M3 (torch._scaled_mm, BF16 out) n x n x n GEMM TFLOP/s."""
    out = {}
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out["bf16_gemm_tflops"] = 2 * n**3 / time_ms(lambda: a @ b, reps=reps) / 1e9
    # _scaled_mm wants A row-major and B column-major.
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    try:
        ms = time_ms(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), reps=reps)
        out["fp8_gemm_tflops"] = 2 * n**3 / ms / 1e9
    except (RuntimeError, TypeError) as e:
        out["fp8_gemm_tflops"] = None
        out["fp8_gemm_error"] = str(e)[:200]
    return out


def copy_tbps(nbytes, reps):
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return 2 * nbytes / time_ms(lambda: y.copy_(x), reps=reps) / 1e9


def measure_ceilings(reps):
    """GEMM ceilings at 8192^3 and the copy ceiling (2 GiB each way: far larger than the 60 MB
    L2, so no rotation is needed)."""
    out = gemm_tflops(8192, reps)
    out["copy_tbps"] = copy_tbps(2 * 1024**3, reps)
    torch.cuda.empty_cache()
    return out


def software():
    """torch, CUDA and cuDNN versions (cuDNN None without a GPU: CPU smoke runs)."""
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None}


def device_name():
    """The GPU's name ("cpu" without one)."""
    cuda = torch.cuda.is_available()
    return torch.cuda.get_device_name(torch.cuda.current_device()) if cuda else "cpu"


def part_doc(suite, revision, config, command=None):
    """The header of a suite's peers part (fwd, decode, paged-prefill, bwd): what ran where, when,
    with which software, and the clocks before; write_part adds the clocks after."""
    doc = record.header(suite, record.revision(revision), device_name(), command)
    doc = {"suite": suite, "part": "peers", **doc}
    doc.update({"software": software(), "clocks": {"before": read_clocks()}, "config": config})
    return doc


def write_part(doc, path, digits=7):
    """The clocks after, then doc as rounded JSON at path."""
    doc["clocks"]["after"] = read_clocks()
    record.write_json(doc, path, digits)
    print(f"wrote {path}")


def attention_flops(b, h, s, d, causal):
    return 4 * b * h * s * s * d / (2 if causal else 1)


def measure_sdpa(peer, d, s, causal, reps, bwd):
    """One record: SDPA forward (and optionally forward+backward) of `peer` on the BHSD grid."""
    h = HIDDEN // d
    b = max(1, TOKENS // s)
    flops = attention_flops(b, h, s, d, causal)
    rec = {"case": f"d{d}-s{s}-{'causal' if causal else 'noncausal'}", "recipe": "bf16",
           "peer": peer, "b": b, "h": h, "h_kv": h, "s_q": s, "s_k": s, "d": d, "causal": causal}
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd)
               for _ in range(3))
    try:
        with sdpa_kernel([BACKENDS[peer]]):
            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = time_ms(fwd, reps=reps)
            rec["ms"] = ms
            rec["tflops"] = flops / ms / 1e9
            if bwd:
                g = torch.randn_like(fwd())

                def fwd_bwd():
                    return torch.autograd.grad(fwd(), (q, k, v), g)
                ms = time_ms(fwd_bwd, reps=max(5, reps // 2))
                rec["fwd_bwd_ms"] = ms
                rec["fwd_bwd_tflops"] = 3.5 * flops / ms / 1e9
    except RuntimeError as e:  # a backend that does not take this shape
        rec["error"] = (str(e).splitlines() or ["RuntimeError"])[0][:200]
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="d=128, s in {4k, 16k}, fewer repetitions")
    ap.add_argument("--bwd", action="store_true", help="also time forward+backward")
    record.add_revision_flag(ap)
    ap.add_argument("--reps", type=int, default=None, help="timed calls per point (default 20, quick 10)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device")
    reps = args.reps or (10 if args.quick else 20)
    dims = (128,) if args.quick else (64, 128)
    seqs = (4096, 16384) if args.quick else (1024, 2048, 4096, 8192, 16384)

    torch.manual_seed(0)
    doc = record.header("peers", record.revision(args.revision), device_name())
    doc.update({"software": software(), "clocks": {"before": read_clocks()}})
    ceilings = measure_ceilings(reps)
    doc["ceilings"] = ceilings
    print(f"peers on {doc['device']}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in ceilings.items() if isinstance(v, float)), flush=True)

    records = []
    print(f"{'case':<22} {'peer':<16} {'ms':>9} {'TFLOP/s':>8}", flush=True)
    for d in dims:
        for s in seqs:
            for causal in (False, True):
                for peer in BACKENDS:
                    r = measure_sdpa(peer, d, s, causal, reps, args.bwd)
                    fp8 = ceilings.get("fp8_gemm_tflops")
                    if "tflops" in r and fp8:
                        r["fraction_of_fp8_gemm"] = r["tflops"] / fp8
                    records.append(r)
                    if "error" in r:
                        print(f"{r['case']:<22} {peer:<16} error: {r['error']}", flush=True)
                    else:
                        print(f"{r['case']:<22} {peer:<16} {r['ms']:9.4f} {r['tflops']:8.1f}",
                              flush=True)
                torch.cuda.empty_cache()
    doc["clocks"]["after"] = read_clocks()
    doc["records"] = records
    record.write_json(doc, args.out, digits=5)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
