#!/usr/bin/env python3
"""The BF16 peer of the decode suite, measured with the device's PyTorch in the same gpu-check call.

torch SDPA in BF16 on a contiguous BF16 KV cache of the same shape as fp4attn_bench decode's
(q [b, 32, 1, 128], k and v [b, 8, L, 128], GQA through enable_gqa), with the cuDNN backend
("sdpa-cudnn-bf16", issue 9's peer) and the flash backend ("sdpa-flash-bf16"). A backend that
rejects enable_gqa is retried with K and V expanded to the query heads (repeat_interleave, done
once before timing; the record says "kv": "expanded", and the bytes it reads are 4x). Timed as
fp4attn_bench decode times the kernel: CUDA events around each call after warm-up, at least
--min-reps calls and --min-time-ms, median; caches smaller than 4x the L2 rotate over copies so
that reads come from HBM. tbps counts the logical BF16 cache (b * L * 8 * 128 * 2 * 2 bytes) plus
q. Ceilings: the copy ceiling of bench/peers.py and a read-only one (a sum over 2 GiB).

    python3 bench/decode_peers.py OUT.json [--quick] [--revision SHA] [--points 32:4096,...]
    python3 bench/decode_peers.py --merge OURS.json PEERS.json -o decode.json [--api API.json]
                                  [--command ...]

--merge writes the record of bench/results/decode.json: one record per cache format x grid point
with the peer's peer_ms from the same run and speedup = peer_ms / ms, path "kernel" (issue 22's
kernel target: NVFP4 >= 3.0x at b=32 L=32k; every other point >= 1.0x). --api adds the records of
bench/decode_api.py from the same device call: paths "api" and "api-graph" (the public Python API
eagerly and replayed in a CUDA graph, each against SDPA cuDNN BF16 timed the same way).
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the records' shared head, merge warnings and file writing

H, H_KV, D = 32, 8, 128


def grid(quick):
    """(b, L) in fp4attn_bench decode's order (bench/cpp/decode_suite.cc, decode_grid)."""
    g = [(32, 4096), (32, 32768)]
    if quick:
        return g + [(1, 32768), (256, 8192)]
    return g + [(b, l) for b in (1, 8, 64, 256) for l in (1024, 8192, 32768)]


def case_name(b, l):
    return f"b{b}-L{l}"


def merge(ours_path, peers_path, out_path, command, api_paths=()):
    ours = json.load(open(ours_path))
    peers_doc = json.load(open(peers_path))
    api_docs = [json.load(open(p)) for p in api_paths or ()]
    # Several API runs (e.g. s_q = 1 and speculative s_q = 4) join as one.
    api_doc = {"records": [r for d in api_docs for r in d.get("records", [])],
               "command": " ; ".join(d.get("command") or "" for d in api_docs)} if api_docs else None
    by_case = {}
    for p in peers_doc.get("records", []):
        by_case.setdefault(p["case"], {})[p["peer"]] = p
    records, warnings = [], record.part_warnings("decode", ours, peers_doc)
    targets = {(32, 32768): 3.0}
    summary = {}
    for r in ours.get("records", []):
        peer = by_case.get(r["case"], {})
        ref = peer.get("sdpa-cudnn-bf16")
        if ref is None or "ms" not in ref:
            ref = peer.get("sdpa-flash-bf16")
        rec = {"path": "kernel", "s_q": 1, **r}
        if ref is not None and "ms" in ref and "ms" in r:
            rec.update(peer=ref["peer"], peer_ms=ref["ms"], peer_tbps=ref.get("tbps"),
                       peer_kv=ref.get("kv"), speedup=ref["ms"] / r["ms"])
            t = targets.get((r["b"], r["s_k"]), 1.0) if r["recipe"] == "nvfp4" else 1.0
            rec.update(target_speedup=t, meets_target=rec["speedup"] >= t)
        else:
            warnings.append(f"{r['case']} {r['recipe']}: no peer time")
        records.append(rec)
        s = summary.setdefault(f"{r['recipe']} kernel", {"points": 0, "errors": 0,
                               "speedups": [], "meets_target": True, "min_cos": None})
        s["points"] += 1
        if "error" in r or "speedup" not in rec:
            s["errors"] += "error" in r
            s["meets_target"] = False
        if "speedup" in rec:
            s["speedups"].append(rec["speedup"])
            s["meets_target"] = s["meets_target"] and rec["meets_target"]
        if r.get("cos") is not None:
            s["min_cos"] = r["cos"] if s["min_cos"] is None else min(s["min_cos"], r["cos"])
    for r in (api_doc or {}).get("records", []):
        if "recipe" not in r:
            continue  # the peer's own timings stay in "peers"
        records.append(r)
        sq = f" s_q {r['s_q']}" if r.get("s_q", 1) != 1 else ""
        s = summary.setdefault(f"{r['recipe']} {r['path']}{sq}", {"points": 0, "errors": 0,
                               "speedups": [], "meets_target": True, "min_cos": None})
        s["points"] += 1
        if "speedup" in r:
            s["speedups"].append(r["speedup"])
            s["meets_target"] = s["meets_target"] and r.get("meets_target", True)
        else:
            s["errors"] += 1
            s["meets_target"] = False
            warnings.append(f"{r['case']} {r['recipe']} {r['path']}: no time or no peer time")
    for s in summary.values():
        sp = s.pop("speedups")
        s["min_speedup"] = min(sp) if sp else None
        s["geomean_speedup"] = math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None
    doc = record.header("decode", ours.get("revision"), ours.get("device"), command,
                        ours.get("date"))
    doc |= {
        "commands": {"ours": ours.get("command"), "peers": peers_doc.get("command"),
                     "api": (api_doc or {}).get("command")},
        "software": peers_doc.get("software"),
        "ceilings": {**ours.get("ceilings", {}),
                     **{f"{k}_torch": v for k, v in peers_doc.get("ceilings", {}).items()}},
        "clocks": {"ours": ours.get("clocks"), "peers": peers_doc.get("clocks")},
        "config": ours.get("config"),
        "complete": bool(ours.get("complete")),
        "summary": summary,
        "warnings": warnings,
        "records": records,
        "peers": peers_doc.get("records", [])
        + [r for r in (api_doc or {}).get("records", []) if "recipe" not in r],
    }
    record.write_json(doc, out_path)
    print(f"wrote {out_path}: {len(records)} records, {len(warnings)} warnings")
    for k, s in summary.items():
        print(f"  {k}: min speedup {s['min_speedup']}, geomean {s['geomean_speedup']}, "
              f"meets targets {s['meets_target']}")


def measure(args):
    import peers  # bench/peers.py: backends, clocks, rounding (imports torch)
    import torch
    import torch.nn.functional as F
    from fwd_peers import sm_clock_mhz, time_stats
    from torch.nn.attention import sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("decode_peers.py: no CUDA device")
    dev = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(dev, "L2_cache_size", 60 * 1024**2)
    doc = peers.part_doc("decode", args.revision, {
        "warmup": args.warmup, "min_reps": args.min_reps, "min_time_ms": args.min_time_ms,
        "layout": "q [b, 32, 1, 128], k/v [b, 8, L, 128] BF16 contiguous, torch.randn"})
    nbytes = 2 * 1024**3
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    read_ms = peers.time_ms(lambda: x.sum(dtype=torch.float32), reps=10)
    doc["ceilings"] = {"copy_tbps": peers.copy_tbps(nbytes, 10),
                       "read_tbps": nbytes / read_ms / 1e9}
    del x
    torch.cuda.empty_cache()
    print("decode peers on {}: copy {:.3f} TB/s, read (sum) {:.3f} TB/s".format(
        dev.name, doc["ceilings"]["copy_tbps"], doc["ceilings"]["read_tbps"]), flush=True)

    points = grid(args.quick)
    if args.points:
        points = [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")]
    records = []
    print(f"{'case':<12} {'peer':<16} {'ms':>9} {'TB/s':>7} {'MHz':>6}", flush=True)
    for b, l in points:
        cache_bytes = b * H_KV * l * D * 2 * 2
        slots = max(1, min(64, math.ceil(4 * l2 / cache_bytes)))
        for peer, backend in peers.BACKENDS.items():
            rec = {"case": case_name(b, l), "recipe": "bf16", "peer": peer, "b": b, "h": H,
                   "h_kv": H_KV, "s_q": 1, "s_k": l, "d": D, "slots": slots,
                   "bytes": cache_bytes + b * H * D * 2}
            try:
                qs = [torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(slots)]
                ks = [torch.randn(b, H_KV, l, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(slots)]
                vs = [torch.randn(b, H_KV, l, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(slots)]
                mode = "gqa"
                with sdpa_kernel([backend]):
                    try:
                        F.scaled_dot_product_attention(qs[0], ks[0], vs[0], enable_gqa=True)
                    except RuntimeError:
                        mode = "expanded"
                        ks = [k.repeat_interleave(H // H_KV, dim=1) for k in ks]
                        vs = [v.repeat_interleave(H // H_KV, dim=1) for v in vs]
                    it = [0]

                    def call():
                        i = it[0] % slots
                        it[0] += 1
                        if mode == "gqa":
                            F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                        else:
                            F.scaled_dot_product_attention(qs[i], ks[i], vs[i])
                    med, lo, hi, n = time_stats(call, args.warmup, args.min_reps,
                                                args.min_time_ms)
                rec.update(kv=mode, ms=med, ms_min=lo, ms_max=hi, reps=n,
                           tbps=rec["bytes"] / med / 1e9, sm_mhz=sm_clock_mhz())
                print(f"{rec['case']:<12} {peer:<16} {med:9.4f} {rec['tbps']:7.3f} "
                      f"{rec['sm_mhz'] or 0:6.0f} {mode}", flush=True)
            except (RuntimeError, getattr(torch, "OutOfMemoryError", RuntimeError)) as e:
                rec["error"] = (str(e).splitlines() or ["RuntimeError"])[0][:200]
                print(f"{rec['case']:<12} {peer:<16} error: {rec['error']}", flush=True)
            records.append(rec)
            qs = ks = vs = None
            torch.cuda.empty_cache()
    doc["records"] = records
    peers.write_part(doc, args.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="JSON file to write (measuring)")
    ap.add_argument("--merge", nargs=2, metavar=("OURS", "PEERS"),
                    help="merge fp4attn_bench decode's JSON and this script's into -o")
    ap.add_argument("-o", "--output", help="the merged record (with --merge)")
    ap.add_argument("--api", nargs="+", default=(),
                    help="bench/decode_api.py's JSON files of the same call (with --merge)")
    ap.add_argument("--command", default=None, help="the command recorded in the merged JSON")
    ap.add_argument("--quick", action="store_true", help="4 points, shorter timing")
    ap.add_argument("--points", help="b:L pairs instead of the grid, e.g. 32:4096,1:32768")
    record.add_revision_flag(ap)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--min-time-ms", type=float, default=None, help="default 100, quick 30")
    args = ap.parse_args()
    if args.merge:
        if not args.output:
            ap.error("--merge needs -o")
        merge(args.merge[0], args.merge[1], args.output, args.command or record.command_line(),
              args.api)
        return
    if not args.out:
        ap.error("OUT.json is required when measuring")
    if args.min_time_ms is None:
        args.min_time_ms = 30.0 if args.quick else 100.0
    measure(args)


if __name__ == "__main__":
    main()
