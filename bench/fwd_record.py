#!/usr/bin/env python3
"""Merges fp4attn_bench's fwd JSON and bench/fwd_peers.py's JSON of the same run into the fwd
record (bench/results/fwd.json, docs/design.md's record schema).

    python3 bench/fwd_record.py OURS.json PEERS.json -o fwd.json [--command "scripts/gpu-check ..."]
                                [--bound NOSM.json]
    python3 bench/fwd_record.py --selftest

--bound: the JSON of `fp4attn_bench fwd --bound --recipes fp8` (the no-softmax bound: the softmax
replaced by a constant P, wrong results); its fp8 records join ours as recipe "bound-no-softmax"
(their cos / rel_l2 dropped: they measure nothing).

records: one per recipe x grid point x peer: our fields (ms, ms_min, ms_max, reps, tflops,
quant_ms and its q/k/v parts, cos, rel_l2 on the sampled rows, sm_mhz) with `peer`, `peer_ms`,
`peer_tflops` and `speedup` = peer_ms / ms; first the cuDNN BF16 peer ("sdpa-cudnn-bf16", with
`target_speedup` and `meets_target` from issue 4), then FA2 ("sdpa-flash-bf16"). peers: the peer
measurements themselves. accuracy: the FA3-shape records (ours and the peers'). Header: revision,
device, date, command, ceilings (FP8/BF16 GEMM from the peers, copy from both), the SM clock
(sm_clock_mhz: measured under load by fp4attn_bench; peer_sm_clock_mhz likewise for the peers),
summary per recipe.
"""

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the records' shared head, merge warnings and file writing

CUDNN = "sdpa-cudnn-bf16"
FLASH = "sdpa-flash-bf16"
PEERS = (CUDNN, FLASH)

# Our fields copied into each merged record, in this order.
OUR_FIELDS = ("case", "recipe", "b", "h", "h_kv", "s_q", "s_k", "d", "causal", "ms", "ms_min",
              "ms_max", "reps", "tflops", "quant_ms", "quant_q_ms", "quant_k_ms", "quant_v_ms",
              "cos", "rel_l2", "max_abs", "nan_mismatch", "acc_rows", "acc_slice", "sm_mhz",
              "error")


def target_speedup(d, s):
    """Issue 4's bar against cuDNN BF16: d=128 >= 1.4x at s=4k and 1.45x at s >= 8k; d=64 >= 1.3x
    at s >= 4k; no point slower than cuDNN (1.0x) anywhere else."""
    if d == 128 and s >= 8192:
        return 1.45
    if d == 128 and s >= 4096:
        return 1.4
    if d == 64 and s >= 4096:
        return 1.3
    return 1.0


def key(r):
    return (r["d"], r["s_q"], r["s_k"], bool(r["causal"]))


def median(xs):
    xs = sorted(x for x in xs if isinstance(x, (int, float)))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def merge_record(ours, peer_name, peer):
    rec = {f: ours[f] for f in OUR_FIELDS if f in ours}
    rec["peer"] = peer_name
    if peer is None:
        rec["peer_error"] = "not measured in this run"
    elif "error" in peer:
        rec["peer_error"] = peer["error"]
    else:
        rec["peer_ms"] = peer["ms"]
        rec["peer_tflops"] = peer["tflops"]
        if ours.get("ms"):
            rec["speedup"] = round(peer["ms"] / ours["ms"], 4)
    if peer_name == CUDNN:
        rec["target_speedup"] = target_speedup(ours["d"], ours["s_q"])
        if "speedup" in rec:
            rec["meets_target"] = rec["speedup"] >= rec["target_speedup"]
    return rec


def summarize(records):
    """Per recipe: points, how many meet their target, min and geometric-mean speedup (cuDNN)."""
    out = {}
    for r in records:
        if r["peer"] != CUDNN:
            continue
        s = out.setdefault(r["recipe"], {"points": 0, "errors": 0, "meets_target": 0,
                                         "min_speedup": None, "geomean_speedup": None,
                                         "min_cos": None, "max_rel_l2": None, "_logs": []})
        s["points"] += 1
        if "error" in r or "speedup" not in r:
            s["errors"] += 1
            continue
        s["meets_target"] += bool(r.get("meets_target"))
        s["_logs"].append(math.log(r["speedup"]))
        s["min_speedup"] = min(r["speedup"], s["min_speedup"] or math.inf)
        if isinstance(r.get("cos"), (int, float)):
            s["min_cos"] = min(r["cos"], s["min_cos"] if s["min_cos"] is not None else math.inf)
        if isinstance(r.get("rel_l2"), (int, float)):
            s["max_rel_l2"] = max(r["rel_l2"], s["max_rel_l2"] or 0.0)
    for s in out.values():
        logs = s.pop("_logs")
        if logs:
            s["geomean_speedup"] = round(math.exp(sum(logs) / len(logs)), 4)
    return out


BOUND = "bound-no-softmax"


def bound_records(nosm):
    """The bound run's fp8 records, renamed to the bound recipe, errors dropped."""
    out = []
    for r in nosm.get("records", []):
        if r.get("recipe") != "fp8":
            continue
        r = {k: v for k, v in r.items() if k not in ("cos", "rel_l2", "max_abs", "nan_mismatch")}
        r["recipe"] = BOUND
        out.append(r)
    return out


def merge(ours, peers_doc, command=None, nosm=None):
    warnings = record.part_warnings("fwd", ours, peers_doc)
    peer_recs = {(key(r), r["peer"]): r for r in peers_doc.get("records", [])}

    records = []
    bound = bound_records(nosm) if nosm is not None else []
    if nosm is not None and nosm.get("revision") != ours.get("revision"):
        warnings.append(f"revision differs: bound build {nosm.get('revision')!r}")
    for r in ours.get("records", []) + bound:
        for p in PEERS:
            records.append(merge_record(r, p, peer_recs.get((key(r), p))))
    missing = sorted({r["case"] for r in ours.get("records", [])
                      if (key(r), CUDNN) not in peer_recs})
    if missing:
        warnings.append("no cuDNN peer for " + ", ".join(missing))

    oc, pc = ours.get("ceilings") or {}, peers_doc.get("ceilings") or {}
    ceilings = {"fp8_gemm_tflops": pc.get("fp8_gemm_tflops"),
                "bf16_gemm_tflops": pc.get("bf16_gemm_tflops"),
                "copy_tbps": oc.get("copy_tbps", pc.get("copy_tbps")),
                "copy_tbps_torch": pc.get("copy_tbps")}
    for k in ("copy_memcpy_tbps", "copy_kernel_tbps", "copy_bytes"):
        if k in oc:
            ceilings[k] = oc[k]
    if "fp8_gemm_error" in pc:
        ceilings["fp8_gemm_error"] = pc["fp8_gemm_error"]

    oclk, pclk = ours.get("clocks") or {}, peers_doc.get("clocks") or {}
    doc = record.header("fwd", ours.get("revision"), ours.get("device"),
                        command or ours.get("command"), ours.get("date"))
    doc |= {
        "commands": {"fp4attn_bench": ours.get("command"), "peers": peers_doc.get("command"),
                     **({"bound": nosm.get("command")} if nosm is not None else {})},
        "software": peers_doc.get("software"),
        "ceilings": ceilings,
        "sm_clock_mhz": ours.get("sm_clock_mhz"),
        "sm_clock_min_mhz": ours.get("sm_clock_min_mhz"),
        "sm_clock_peak_mhz": ours.get("sm_clock_peak_mhz"),
        "peer_sm_clock_mhz": median(r.get("sm_mhz") for r in peers_doc.get("records", [])),
        "clocks": {"before": oclk.get("before"), "after": oclk.get("after"),
                   "peers_before": pclk.get("before"), "peers_after": pclk.get("after")},
        "config": ours.get("config"),
        "peers_config": peers_doc.get("config"),
        "complete": bool(ours.get("complete")),
        "summary": summarize(records),
        "records": records,
        "peers": peers_doc.get("records", []),
        "accuracy": list(ours.get("accuracy", [])) + list(peers_doc.get("accuracy", [])),
    }
    if warnings:
        doc["warnings"] = warnings
    return doc


# ---- self-test (no GPU): synthetic inputs through the merge -------------------------------------

def synthetic_inputs(quick=False):
    """fp4attn_bench-like and fwd_peers-like documents with made-up figures."""
    dims = (128,) if quick else (64, 128)
    seqs = (4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384)
    ours = {"suite": "fwd", "part": "fp4attn_bench", "revision": "abc123", "device": "NVIDIA H200",
            "date": "2026-12-01T00:00:00Z", "command": "fp4attn_bench fwd --out x.json",
            "complete": True, "ceilings": {"copy_tbps": 4.3, "copy_memcpy_tbps": 4.2,
                                           "copy_kernel_tbps": 4.3, "copy_bytes": 1 << 30},
            "sm_clock_mhz": 1980, "sm_clock_min_mhz": 1965, "sm_clock_peak_mhz": 1980,
            "clocks": {"before": {"sm_mhz": 345}, "after": {"sm_mhz": 1980}}, "config": {},
            "records": [], "accuracy": [{"case": "fa3-d128-s2048-noncausal", "recipe": "fp8",
                                         "cos": 0.9991, "rel_l2": 0.041, "slices_compared": 32,
                                         "slices_total": 128}]}
    peers_doc = {"suite": "fwd", "part": "peers", "revision": "abc123", "device": "NVIDIA H200",
                 "command": "python3 bench/fwd_peers.py y.json", "software": {"torch": "2.11"},
                 "ceilings": {"fp8_gemm_tflops": 1450.0, "bf16_gemm_tflops": 800.0,
                              "copy_tbps": 4.25},
                 "clocks": {}, "records": [], "accuracy": []}
    for d in dims:
        h = 2048 // d
        for s in seqs:
            for causal in (False, True):
                b = 16384 // s
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                shape = {"b": b, "h": h, "h_kv": h, "s_q": s, "s_k": s, "d": d, "causal": causal}
                case = f"d{d}-s{s}-{'causal' if causal else 'noncausal'}"
                for recipe, rate in (("fp8", 950.0 if d == 128 else 700.0), ("nvfp4", 900.0)):
                    ms = flops / rate / 1e9
                    ours["records"].append({"case": case, "recipe": recipe, **shape, "ms": ms,
                                            "ms_min": ms * 0.99, "ms_max": ms * 1.02, "reps": 50,
                                            "tflops": rate, "quant_ms": 0.05, "cos": 0.9992,
                                            "rel_l2": 0.04, "acc_rows": 256, "sm_mhz": 1980})
                for peer, rate in ((CUDNN, 650.0 if d == 128 else 470.0), (FLASH, 340.0)):
                    peers_doc["records"].append({"case": case, "recipe": "bf16", "peer": peer,
                                                 **shape, "ms": flops / rate / 1e9,
                                                 "tflops": rate, "sm_mhz": 1980})
    ours["records"].append({"case": "d128-s1024-noncausal", "recipe": "mxfp4", "b": 16, "h": 16,
                            "h_kv": 16, "s_q": 1024, "s_k": 1024, "d": 128, "causal": False,
                            "error": "recipe not supported"})
    return ours, peers_doc


def selftest():
    ours, peers_doc = synthetic_inputs()
    doc = merge(ours, peers_doc, command="scripts/gpu-check --bench=fwd")
    n_ours = len(ours["records"])
    assert len(doc["records"]) == 2 * n_ours, len(doc["records"])
    for r in doc["records"]:
        for f in ("case", "recipe", "b", "h", "h_kv", "s_q", "s_k", "d", "causal", "peer"):
            assert f in r, (f, r)
        if "error" not in r:
            for f in ("ms", "tflops", "peer_ms", "speedup", "cos", "rel_l2"):
                assert f in r, (f, r)
            assert abs(r["speedup"] - r["peer_ms"] / r["ms"]) < 1e-3 * r["speedup"]
    cud = [r for r in doc["records"] if r["peer"] == CUDNN and "speedup" in r]
    assert all("meets_target" in r for r in cud)
    d128_8k = next(r for r in cud if r["d"] == 128 and r["s_q"] == 8192 and r["recipe"] == "fp8")
    assert d128_8k["target_speedup"] == 1.45 and abs(d128_8k["speedup"] - 950 / 650) < 1e-3
    assert doc["summary"]["fp8"]["points"] == 20 and doc["summary"]["mxfp4"]["errors"] == 1
    assert doc["ceilings"]["fp8_gemm_tflops"] == 1450.0 and doc["ceilings"]["copy_tbps"] == 4.3
    assert doc["sm_clock_mhz"] == 1980 and "warnings" not in doc, doc.get("warnings")
    nosm = {"revision": "abc123", "command": "nosm/fp4attn_bench fwd",
            "records": [dict(r, ms=r["ms"] / 2) for r in ours["records"] if "ms" in r]}
    with_bound = merge(ours, peers_doc, nosm=nosm)
    bound = [r for r in with_bound["records"] if r["recipe"] == BOUND]
    assert len(bound) == 2 * sum(r["recipe"] == "fp8" for r in ours["records"]), len(bound)
    assert all("cos" not in r and "speedup" in r for r in bound)
    assert with_bound["summary"][BOUND]["points"] == 20 and "warnings" not in with_bound
    peers_doc["revision"] = "other"
    assert any("revision" in w for w in merge(ours, peers_doc)["warnings"])
    with tempfile.TemporaryDirectory() as tmp:  # the JSON round trip
        record.write_json(doc, os.path.join(tmp, "fwd.json"))
        with open(os.path.join(tmp, "fwd.json")) as f:
            assert json.load(f) == doc
    print("fwd_record.py selftest: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ours", nargs="?", help="fp4attn_bench fwd JSON")
    ap.add_argument("peers", nargs="?", help="bench/fwd_peers.py JSON")
    ap.add_argument("-o", "--out", help="merged JSON (default: fwd.json beside OURS)")
    ap.add_argument("--command", help="the command of record (e.g. the gpu-check call)")
    ap.add_argument("--bound", metavar="NOSM.json",
                    help="JSON of fp4attn_bench fwd --bound --recipes fp8")
    ap.add_argument("--selftest", action="store_true", help="merge synthetic inputs and check")
    ap.add_argument("--synthetic", metavar="DIR",
                    help="write synthetic OURS/PEERS inputs to DIR (to try the scripts)")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.synthetic:
        ours, peers_doc = synthetic_inputs()
        record.write_json(ours, os.path.join(args.synthetic, "fwd-ours.json"))
        record.write_json(peers_doc, os.path.join(args.synthetic, "fwd-peers.json"))
        print(f"wrote {args.synthetic}/fwd-ours.json and fwd-peers.json")
        return 0
    if not args.ours or not args.peers:
        ap.error("OURS.json and PEERS.json are needed")
    with open(args.ours) as f:
        ours = json.load(f)
    with open(args.peers) as f:
        peers_doc = json.load(f)
    nosm = None
    if args.bound:
        with open(args.bound) as f:
            nosm = json.load(f)
    doc = merge(ours, peers_doc, args.command, nosm)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.ours)), "fwd.json")
    record.write_json(doc, out)
    for w in doc.get("warnings", []):
        print(f"fwd_record.py: warning: {w}", file=sys.stderr)
    for recipe, s in doc["summary"].items():
        print(f"{recipe}: {s['meets_target']}/{s['points']} points meet issue 4's target "
              f"(min {s['min_speedup']}x, geomean {s['geomean_speedup']}x cuDNN BF16, "
              f"{s['errors']} errors)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
