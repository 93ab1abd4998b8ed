#!/usr/bin/env python3
"""The BF16 peer of the paged-prefill suite, measured with the device's PyTorch in the same
gpu-check call. torch SDPA in BF16 with the cuDNN backend ("sdpa-cudnn-bf16", issue 9's peer; the
flash backend as "sdpa-flash-bf16") on a contiguous BF16 cache of the same shape as
fp4attn_bench paged-prefill's: q [b, 32, chunk, 128], k and v [b, 8, L, 128] (L includes the
chunk), GQA through enable_gqa (retried with K/V expanded to the query heads when a backend
rejects it; the record says "kv": "expanded").

Causal masking: SDPA's is_causal is TOP-LEFT aligned (query i sees keys j <= i), which for a chunk
of 2048 queries over 32k keys would hide all but the first keys. The prefill needs BOTTOM-RIGHT
alignment (query i of s_q sees j <= i + L - s_q, numerics.md §1). The script passes
torch.nn.attention.bias.causal_lower_right(s_q, L) ("mask": "causal_lower_right"); a backend that
rejects it gets an explicit boolean [s_q, L] mask ("mask": "bool"). Both are checked once per
point against a float32 reference on a few rows before timing (max abs error recorded).
Timed with CUDA events (warm-up, median of at least --min-reps calls and --min-time-ms).
    python3 bench/paged_prefill_peers.py OUT.json [--quick] [--revision SHA] [--lens 8192,32768]
    python3 bench/paged_prefill_peers.py --merge OURS.json PEERS.json -o paged_prefill.json
--merge writes bench/results/paged_prefill.json's records: recipe = cache format, b, s_q = chunk,
s_k = cached length, ms, tflops, peer_ms, speedup = peer_ms / ms (target >= 1.0), cos, rel_l2.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the records' shared head, merge warnings and file writing

H, H_KV, D = 32, 8, 128


def case_name(b, chunk, l):
    return f"b{b}-c{chunk}-L{l}"


def flops(b, chunk, l):
    """4 h d x visible (query, key) pairs, bottom-right causal (as fp4attn_bench counts)."""
    return 4.0 * H * D * b * (chunk * (l - chunk) + chunk * (chunk + 1) / 2)


def merge(ours_path, peers_path, out_path, command):
    ours = json.load(open(ours_path))
    peers_doc = json.load(open(peers_path))
    by_case = {}
    for p in peers_doc.get("records", []):
        by_case.setdefault(p["case"], {})[p["peer"]] = p
    warnings, records, summary = record.part_warnings("paged-prefill", ours, peers_doc), [], {}
    for r in ours.get("records", []):
        peer = by_case.get(r["case"], {})
        ref = peer.get("sdpa-cudnn-bf16")
        if ref is None or "ms" not in ref:
            ref = peer.get("sdpa-flash-bf16")
        rec = dict(r)
        if ref is not None and "ms" in ref and "ms" in r:
            rec.update(peer=ref["peer"], peer_ms=ref["ms"], peer_tflops=ref.get("tflops"),
                       peer_kv=ref.get("kv"), peer_mask=ref.get("mask"),
                       speedup=ref["ms"] / r["ms"], engine_speedup=ref["ms"] / r["engine_ms"],
                       target_speedup=1.0)
            rec["meets_target"] = rec["speedup"] >= 1.0
        else:
            warnings.append(f"{r['case']} {r['recipe']}: no peer time")
        records.append(rec)
        s = summary.setdefault(r["recipe"], {"points": 0, "speedups": [], "meets_target": True})
        s["points"] += 1
        if "speedup" in rec:
            s["speedups"].append(rec["speedup"])
            s["meets_target"] = s["meets_target"] and rec["meets_target"]
        else:
            s["meets_target"] = False
    for s in summary.values():
        sp = s.pop("speedups")
        s["min_speedup"] = min(sp) if sp else None
    doc = record.header("paged-prefill", ours.get("revision"), ours.get("device"), command,
                        ours.get("date"))
    doc |= {
        "commands": {"ours": ours.get("command"), "peers": peers_doc.get("command")},
        "software": peers_doc.get("software"),
        "config": ours.get("config"),
        "complete": bool(ours.get("complete")),
        "summary": summary,
        "warnings": warnings,
        "records": records,
        "peers": peers_doc.get("records", []),
    }
    record.write_json(doc, out_path)
    print(f"wrote {out_path}: {len(records)} records, {len(warnings)} warnings")
    for k, s in summary.items():
        print(f"  {k}: min speedup {s['min_speedup']}, meets target {s['meets_target']}")


def measure(args):
    import peers  # bench/peers.py: backends, clocks, rounding (imports torch)
    import torch
    import torch.nn.functional as F
    from fwd_peers import sm_clock_mhz, time_stats
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    if not torch.cuda.is_available():
        sys.exit("paged_prefill_peers.py: no CUDA device")
    b, chunk = args.batch, args.chunk
    doc = peers.part_doc("paged-prefill", args.revision, {
        "warmup": args.warmup, "min_reps": args.min_reps, "min_time_ms": args.min_time_ms,
        "layout": f"q [{b}, 32, {chunk}, 128], k/v [{b}, 8, L, 128] BF16 contiguous, "
                  "torch.randn; causal bottom-right"})
    records = []
    print(f"{'case':<18} {'peer':<16} {'ms':>9} {'TFLOP/s':>8} {'mask':>18} {'kv':>8}",
          flush=True)
    for l in args.lens:
        for peer, backend in peers.BACKENDS.items():
            rec = {"case": case_name(b, chunk, l), "recipe": "bf16", "peer": peer, "b": b, "h": H,
                   "h_kv": H_KV, "s_q": chunk, "s_k": l, "d": D, "causal": True}
            q = k = v = mask = None
            try:
                q = torch.randn(b, H, chunk, D, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, H_KV, l, D, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, H_KV, l, D, device="cuda", dtype=torch.bfloat16)
                i = torch.arange(chunk, device="cuda").unsqueeze(1)
                j = torch.arange(l, device="cuda").unsqueeze(0)
                bool_mask = j <= i + (l - chunk)
                with sdpa_kernel([backend]):
                    chosen = None
                    for kv_mode in ("gqa", "expanded"):
                        if kv_mode == "expanded":
                            k = k.repeat_interleave(H // H_KV, dim=1)
                            v = v.repeat_interleave(H // H_KV, dim=1)
                        for mask_name, m in (("causal_lower_right", causal_lower_right(chunk, l)),
                                             ("bool", bool_mask)):
                            try:
                                kw = {"enable_gqa": True} if kv_mode == "gqa" else {}
                                out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
                                torch.cuda.synchronize()
                                chosen = (kv_mode, mask_name, m, kw, out)
                                break
                            except RuntimeError:
                                continue
                        if chosen:
                            break
                    if chosen is None:
                        raise RuntimeError("the backend takes neither mask form")
                    kv_mode, mask_name, mask, kw, out = chosen
                    # Bottom-right check on the first and last query rows of sequence 0, head 0.
                    kk = k[0, 0].float() if kv_mode == "expanded" else k[0, 0].float()
                    vv = v[0, 0].float()
                    err = 0.0
                    for r in (0, chunk - 1):
                        s = (q[0, 0, r].float() @ kk.T) / math.sqrt(D)
                        s[r + (l - chunk) + 1:] = -float("inf")
                        ref = torch.softmax(s, dim=0) @ vv
                        err = max(err, (out[0, 0, r].float() - ref).abs().max().item())
                    out = None

                    def call():
                        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

                    med, lo, hi, n = time_stats(call, args.warmup, args.min_reps,
                                                args.min_time_ms)
                rec.update(kv=kv_mode, mask=mask_name, mask_check_max_abs=err, ms=med, ms_min=lo,
                           ms_max=hi, reps=n, tflops=flops(b, chunk, l) / med / 1e9,
                           sm_mhz=sm_clock_mhz())
                print(f"{rec['case']:<18} {peer:<16} {med:9.4f} {rec['tflops']:8.1f} "
                      f"{mask_name:>18} {kv_mode:>8} (mask check {err:.2g})", flush=True)
            except (RuntimeError, getattr(torch, "OutOfMemoryError", RuntimeError)) as e:
                rec["error"] = (str(e).splitlines() or ["RuntimeError"])[0][:200]
                print(f"{rec['case']:<18} {peer:<16} error: {rec['error']}", flush=True)
            records.append(rec)
            q = k = v = mask = bool_mask = None
            torch.cuda.empty_cache()
    doc["records"] = records
    peers.write_part(doc, args.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="JSON file to write (measuring)")
    ap.add_argument("--merge", nargs=2, metavar=("OURS", "PEERS"),
                    help="merge fp4attn_bench paged-prefill's JSON and this script's into -o")
    ap.add_argument("-o", "--output", help="the merged record (with --merge)")
    ap.add_argument("--command", default=None, help="the command recorded in the merged JSON")
    ap.add_argument("--quick", action="store_true", help="shorter timing")
    ap.add_argument("--lens", default="8192,32768", help="cached lengths L (chunk included)")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    record.add_revision_flag(ap)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-reps", type=int, default=10)
    ap.add_argument("--min-time-ms", type=float, default=None, help="default 200, quick 50")
    args = ap.parse_args()
    if args.merge:
        if not args.output:
            ap.error("--merge needs -o")
        merge(args.merge[0], args.merge[1], args.output, args.command or record.command_line())
        return
    if not args.out:
        ap.error("OUT.json is required when measuring")
    args.lens = [int(x) for x in args.lens.split(",")]
    if args.min_time_ms is None:
        args.min_time_ms = 50.0 if args.quick else 200.0
    measure(args)


if __name__ == "__main__":
    main()
