#!/usr/bin/env python3
"""Turns benchmark suite JSON (DESIGN.md schema) into a Markdown table and a PNG plot.

    python3 bench/plot.py FILE.json [FILE.json ...] [--out-dir DIR] [--markdown FILE] [--no-png]

For each FILE.json it writes FILE.md and FILE.png beside it (or in --out-dir); --markdown FILE
writes all the tables into that one file instead of one .md each. The tables are also printed.
The PNG needs matplotlib: when it is missing the plot is skipped with a message, the table is
still written.

quantize: TB/s and efficiency (TB/s / copy_tbps of the same run) against input bytes, per case.
peers: TFLOP/s against sequence length, one panel per (d, causal), one line per backend.
fwd (bench/fwd_record.py's merged record): per recipe a table against cuDNN BF16 and FA2 with
issue 4's targets, the FA3-shape accuracy; the plot: speedup over cuDNN and TFLOP/s per d.
Any other suite: a table of the usual record fields and a bar chart of tflops or tbps.
"""

import argparse
import json
import os
import sys
from collections import OrderedDict


def fmt_bytes(n):
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):g} MiB"
    return f"{n} B"


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def clocks_line(doc):
    clocks = doc.get("clocks") or {}
    parts = []
    for when in ("before", "after"):
        c = clocks.get(when) or {}
        if c.get("sm_mhz") is not None:
            parts.append(f"{when} {fmt(c.get('sm_mhz'), 4)} MHz (max {fmt(c.get('max_sm_mhz'), 4)}, "
                         f"{fmt(c.get('power_w'), 3)} W, {fmt(c.get('temp_c'), 2)} C)")
    return "SM clock " + "; ".join(parts) if parts else "SM clock: not recorded"


def header_md(doc):
    lines = [f"## {doc.get('suite', '?')} — {doc.get('device', '?')}", "",
             (f"revision `{doc.get('revision', '?')}`, {doc.get('date', '?')}, "
              f"command `{doc.get('command', '?')}`"), ""]
    ceil = doc.get("ceilings") or {}
    if ceil:
        lines.append("ceilings: " + ", ".join(
            f"{k} {fmt_bytes(v) if k.endswith('_bytes') else fmt(v, 4)}"
            for k, v in ceil.items() if isinstance(v, (int, float))))
    lines += [clocks_line(doc), ""]
    return "\n".join(lines)


# ---- quantize ---------------------------------------------------------------------------------

def quantize_series(doc):
    """{label: [(bytes, record)]} in the order the records come, label = case [global scale]."""
    series = OrderedDict()
    for r in doc.get("records", []):
        label = r["case"] + ("" if r.get("global_scale") in (None, "none", "supplied")
                             else f" [{r['global_scale']}]")
        series.setdefault(label, []).append((r["bytes"], r))
    return series


def quantize_md(doc):
    sizes = sorted({c["bytes"] for c in doc.get("copy", [])} |
                   {r["bytes"] for r in doc.get("records", [])})
    header = ["case", "global scale"] + [fmt_bytes(b) for b in sizes]
    rows = []
    copies = {c["bytes"]: c for c in doc.get("copy", [])}
    for key, name in (("memcpy_tbps", "copy (cudaMemcpyAsync)"), ("kernel_tbps", "copy (kernel)")):
        rows.append([name, "-"] + [fmt(copies[b][key], 4) if b in copies else "" for b in sizes])
    for points in quantize_series(doc).values():
        by_size = dict(points)
        first = points[0][1]
        cells = []
        for b in sizes:
            r = by_size.get(b)
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("error")
            else:
                cells.append(f"{fmt(r['tbps'], 3)} ({100 * r['efficiency']:.0f}%)")
        rows.append([first["case"], first.get("global_scale", "-")] + cells)
    errors = [f"* {r['case']} [{r.get('global_scale')}] at {fmt_bytes(r['bytes'])}: {r['error']}"
              for r in doc.get("records", []) if "error" in r]
    text = ("TB/s = (bytes read + bytes written) / median time; in parentheses the efficiency, "
            "TB/s / copy_tbps of the same run.\n\n" + md_table(header, rows))
    if errors:
        text += "\n\nErrors:\n" + "\n".join(errors[:20])
    return text


def quantize_png(doc, path, plt):
    fig, (ax_bw, ax_eff) = plt.subplots(1, 2, figsize=(14, 6.5))
    copy_ceiling = (doc.get("ceilings") or {}).get("copy_tbps")
    copies = sorted(doc.get("copy", []), key=lambda c: c["bytes"])
    if copies:
        xs = [c["bytes"] for c in copies]
        ax_bw.plot(xs, [max(c["memcpy_tbps"], c["kernel_tbps"]) for c in copies], "k--",
                   lw=2, label="device copy")
    for label, points in quantize_series(doc).items():
        pts = sorted((b, r) for b, r in points if "tbps" in r)
        if not pts:
            continue
        xs = [b for b, _ in pts]
        ax_bw.plot(xs, [r["tbps"] for _, r in pts], "o-", label=label)
        ax_eff.plot(xs, [r["efficiency"] for _, r in pts], "o-", label=label)
    if copy_ceiling:
        ax_bw.axhline(copy_ceiling, color="gray", lw=0.8)
    ax_eff.axhline(0.8, color="red", ls=":", lw=1, label="target 80%")
    for ax, ylabel in ((ax_bw, "TB/s (read + written)"), (ax_eff, "fraction of copy_tbps")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("BF16 input bytes")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ticks = sorted({b for pts in quantize_series(doc).values() for b, _ in pts} |
                       {c["bytes"] for c in copies})
        ax.set_xticks(ticks, [fmt_bytes(b) for b in ticks])
    handles, labels = ax_bw.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"quantize — {doc.get('device')} @ {doc.get('revision')}")
    fig.tight_layout(rect=(0, 0.16, 1, 0.96))
    fig.savefig(path, dpi=110)


# ---- peers ------------------------------------------------------------------------------------

def peers_md(doc):
    recs = doc.get("records", [])
    peers = list(OrderedDict.fromkeys(r["peer"] for r in recs))
    keys = sorted({(r["d"], r["causal"], r["s_q"]) for r in recs})
    by = {(r["d"], r["causal"], r["s_q"], r["peer"]): r for r in recs}
    has_bwd = any("fwd_bwd_tflops" in r for r in recs)
    header = ["d", "causal", "s", "b x h"] + [f"{p} TFLOP/s" for p in peers]
    if has_bwd:
        header += [f"{p} fwd+bwd" for p in peers]
    rows = []
    for d, causal, s in keys:
        any_rec = next(by[(d, causal, s, p)] for p in peers if (d, causal, s, p) in by)
        row = [d, fmt(causal), s, f"{any_rec['b']} x {any_rec['h']}"]
        for field in ("tflops",) + (("fwd_bwd_tflops",) if has_bwd else ()):
            for p in peers:
                r = by.get((d, causal, s, p), {})
                row.append("error" if "error" in r else fmt(r.get(field), 4))
        rows.append(row)
    return ("TFLOP/s = 4·b·h·s²·d (halved for causal) / median time; forward unless marked.\n\n"
            + md_table(header, rows))


def peers_png(doc, path, plt):
    recs = [r for r in doc.get("records", []) if "tflops" in r]
    dims = sorted({r["d"] for r in recs}) or [128]
    fig, axes = plt.subplots(len(dims), 2, figsize=(12, 4.5 * len(dims)), squeeze=False)
    ceil = doc.get("ceilings") or {}
    peers = list(OrderedDict.fromkeys(r["peer"] for r in recs))
    for i, d in enumerate(dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            for p in peers:
                pts = sorted((r["s_q"], r["tflops"]) for r in recs
                             if r["d"] == d and r["causal"] == causal and r["peer"] == p)
                if pts:
                    ax.plot(*zip(*pts), "o-", label=p)
            for key, style in (("fp8_gemm_tflops", ":"), ("bf16_gemm_tflops", "--")):
                if ceil.get(key):
                    ax.axhline(ceil[key], color="gray", ls=style, lw=1, label=key)
            ax.set_xscale("log", base=2)
            seqs = sorted({r["s_q"] for r in recs})
            ax.set_xticks(seqs, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
            ax.set_title(f"d={d}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("sequence length (16k tokens in total)")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"peers — {doc.get('device')} @ {doc.get('revision')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- fwd --------------------------------------------------------------------------------------

FWD_CUDNN, FWD_FLASH = "sdpa-cudnn-bf16", "sdpa-flash-bf16"


def fwd_by_peer(doc, peer):
    """{(recipe, d, causal, s): record} of the merged records against `peer`."""
    return {(r["recipe"], r["d"], r["causal"], r["s_q"]): r
            for r in doc.get("records", []) if r.get("peer") == peer}


def fwd_recipes(doc):
    return list(OrderedDict.fromkeys(r["recipe"] for r in doc.get("records", [])))


def fwd_md(doc):
    cud, fa2 = fwd_by_peer(doc, FWD_CUDNN), fwd_by_peer(doc, FWD_FLASH)
    lines = []
    if doc.get("sm_clock_mhz") is not None:
        lines.append(f"SM clock under load (clock64 spin after each point): ours "
                     f"{fmt(doc.get('sm_clock_mhz'), 4)} MHz (min {fmt(doc.get('sm_clock_min_mhz'), 4)},"
                     f" peak {fmt(doc.get('sm_clock_peak_mhz'), 4)}), peers "
                     f"{fmt(doc.get('peer_sm_clock_mhz'), 4)} MHz.\n")
    lines.append("TFLOP/s = 4·b·h·s²·d (halved for causal) / median kernel time (quantization "
                 "apart: quant ms, Q+K+V); × = peer ms / our ms; target: issue 4's bar against "
                 "cuDNN BF16; cos and rel-L2 against float64 on 256 sampled rows of one (batch, "
                 "head).\n")
    header = ["d", "causal", "s", "b x h", "ms", "TFLOP/s", "cuDNN TFLOP/s", "× cuDNN", "target",
              "FA2 TFLOP/s", "× FA2", "quant ms", "cos", "rel-L2"]
    errors = []
    for recipe in fwd_recipes(doc):
        rows = []
        for k in sorted(k for k in cud if k[0] == recipe):
            r, f = cud[k], fa2.get(k, {})
            if "error" in r:
                errors.append(f"* {recipe} {r['case']}: {r['error']}")
                rows.append([r["d"], fmt(r["causal"]), r["s_q"], f"{r['b']} x {r['h']}", "error"]
                            + [""] * (len(header) - 5))
                continue
            mark = ("" if r.get("meets_target") is None
                    else " ✓" if r["meets_target"] else " ✗")
            rows.append([r["d"], fmt(r["causal"]), r["s_q"], f"{r['b']} x {r['h']}",
                         fmt(r.get("ms"), 4), fmt(r.get("tflops"), 4),
                         fmt(r.get("peer_tflops"), 4), fmt(r.get("speedup"), 3) + mark,
                         fmt(r.get("target_speedup"), 3), fmt(f.get("peer_tflops"), 4),
                         fmt(f.get("speedup"), 3), fmt(r.get("quant_ms"), 3),
                         fmt(r.get("cos"), 7), fmt(r.get("rel_l2"), 3)])
        lines += [f"### {recipe}", "", md_table(header, rows), ""]
        summ = (doc.get("summary") or {}).get(recipe)
        if summ:
            lines += [(f"{summ['meets_target']} of {summ['points']} points meet the target; "
                       f"speedup over cuDNN BF16 min {fmt(summ.get('min_speedup'), 3)}, "
                       f"geometric mean {fmt(summ.get('geomean_speedup'), 3)}."), ""]
    acc = doc.get("accuracy") or []
    if acc:
        rows = []
        for a in acc:
            who = a.get("peer") or f"fp4attn {a.get('recipe')}"
            where = (f"{a['slices_compared']} of {a['slices_total']} (batch, head) slices"
                     if "slices_compared" in a else a.get("reference", ""))
            rows.append([a.get("case"), who, "error: " + a["error"] if "error" in a
                         else fmt(a.get("cos"), 7), fmt(a.get("rel_l2"), 4), where])
        lines += ["### Accuracy at FA3's comparison shape (b=8, h=16, s=2048, d=128, N(0,1))", "",
                  "Full output against float64; FlashAttention-3 FP8: cos 0.9986, rel-L2 0.053.",
                  "", md_table(["case", "kernel", "cos", "rel-L2", "compared"], rows), ""]
    for w in doc.get("warnings", []):
        errors.append(f"* warning: {w}")
    if errors:
        lines += ["Errors and warnings:", ""] + errors[:30]
    return "\n".join(lines)


def fwd_png(doc, path, plt):
    cud, fa2 = fwd_by_peer(doc, FWD_CUDNN), fwd_by_peer(doc, FWD_FLASH)
    dims = sorted({k[1] for k in cud}) or [128]
    seqs = sorted({k[3] for k in cud})
    fig, axes = plt.subplots(2, len(dims), figsize=(7 * len(dims), 10), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, d in enumerate(dims):
        ax_sp, ax_tf = axes[0][j], axes[1][j]
        for i, recipe in enumerate(fwd_recipes(doc)):
            for causal, style in ((False, "o-"), (True, "s--")):
                pts = sorted((k[3], r) for k, r in cud.items()
                             if k[0] == recipe and k[1] == d and k[2] == causal and "speedup" in r)
                if not pts:
                    continue
                label = f"{recipe} {'causal' if causal else 'non-causal'}"
                xs = [s for s, _ in pts]
                ax_sp.plot(xs, [r["speedup"] for _, r in pts], style, color=colors[i % 10],
                           label=label)
                ax_tf.plot(xs, [r["tflops"] for _, r in pts], style, color=colors[i % 10],
                           label=label)
        # The peers' own TFLOP/s (the same for every recipe: take the first one's records).
        first = fwd_recipes(doc)[:1]
        for peer_map, name, color in ((cud, "cuDNN BF16", "black"), (fa2, "FA2 BF16", "gray")):
            for causal, style in ((False, "o:"), (True, "s:")):
                pts = sorted((k[3], r["peer_tflops"]) for k, r in peer_map.items()
                             if k[0] in first and k[1] == d and k[2] == causal
                             and "peer_tflops" in r)
                if pts:
                    ax_tf.plot(*zip(*pts), style, color=color,
                               label=f"{name} {'causal' if causal else 'non-causal'}")
        targets = [(s, next((r["target_speedup"] for k, r in cud.items()
                             if k[1] == d and k[3] == s), 1.0)) for s in seqs]
        if targets:
            ax_sp.step([s for s, _ in targets], [t for _, t in targets], where="mid",
                       color="red", ls=":", lw=1.5, label="issue 4 target")
        ax_sp.axhline(1.0, color="black", lw=0.8)
        ceil = (doc.get("ceilings") or {}).get("fp8_gemm_tflops")
        if ceil:
            ax_tf.axhline(ceil, color="gray", ls="--", lw=1, label="FP8 GEMM ceiling")
        for ax, ylabel in ((ax_sp, "speedup over cuDNN BF16 (peer ms / ms)"),
                           (ax_tf, "TFLOP/s")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
            ax.set_xlabel("sequence length (16k tokens in total)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        ax_sp.set_title(f"d={d}: speedup over cuDNN BF16")
        ax_tf.set_title(f"d={d}: TFLOP/s")
        ax_sp.set_ylim(bottom=0)
        ax_tf.set_ylim(bottom=0)
    fig.suptitle(f"fwd — {doc.get('device')} @ {doc.get('revision')}, SM clock "
                 f"{fmt(doc.get('sm_clock_mhz'), 4)} MHz")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- any other suite --------------------------------------------------------------------------

GENERIC_FIELDS = ("case", "recipe", "peer", "b", "h", "h_kv", "s_q", "s_k", "d", "causal", "ms",
                  "median_ms",
                  "tflops", "tbps", "efficiency", "peer_ms", "speedup", "cos", "rel_l2", "error")


def generic_md(doc):
    recs = doc.get("records", [])
    fields = [f for f in GENERIC_FIELDS if any(f in r for r in recs)]
    return md_table(fields, [[fmt(r.get(f), 4) for f in fields] for r in recs])


def generic_png(doc, path, plt):
    recs = doc.get("records", [])
    metric = "tflops" if any("tflops" in r for r in recs) else "tbps"
    pts = [(f"{r.get('case')} {r.get('recipe', '')}".strip(), r[metric]) for r in recs if metric in r]
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(pts)), 5))
    ax.bar(range(len(pts)), [v for _, v in pts])
    ax.set_xticks(range(len(pts)), [n for n, _ in pts], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{doc.get('suite')} — {doc.get('device')} @ {doc.get('revision')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


SUITES = {"quantize": (quantize_md, quantize_png), "peers": (peers_md, peers_png),
          "fwd": (fwd_md, fwd_png)}


def load_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="suite JSON files")
    ap.add_argument("--out-dir", help="where the .md/.png go (default: beside each JSON)")
    ap.add_argument("--markdown", help="write every table into this one file")
    ap.add_argument("--no-png", action="store_true", help="tables only")
    args = ap.parse_args()

    plt = None if args.no_png else load_pyplot()
    if plt is None and not args.no_png:
        print("plot.py: matplotlib is not installed, PNG plots skipped", file=sys.stderr)
    tables = []
    status = 0
    for path in args.json:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"plot.py: cannot read {path}: {e}", file=sys.stderr)
            status = 1
            continue
        to_md, to_png = SUITES.get(doc.get("suite"), (generic_md, generic_png))
        table = header_md(doc) + "\n" + to_md(doc) + "\n"
        tables.append(table)
        print(table)
        stem = os.path.splitext(os.path.basename(path))[0]
        out_dir = args.out_dir or os.path.dirname(os.path.abspath(path))
        os.makedirs(out_dir, exist_ok=True)
        if not args.markdown:
            with open(os.path.join(out_dir, stem + ".md"), "w") as f:
                f.write(table)
        if plt is not None and doc.get("records"):
            png = os.path.join(out_dir, stem + ".png")
            if to_png(doc, png, plt) is not False:
                print(f"wrote {png}")
            plt.close("all")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(tables))
        print(f"wrote {args.markdown}")
    return status


if __name__ == "__main__":
    sys.exit(main())
