"""The fwd record (bench/fwd_record.py's merge of fp4attn_bench fwd with torch SDPA's BF16
backends): per recipe a table against cuDNN BF16 and FA2 with issue 4's targets and the FA3-shape
accuracy; its figure, fwd.png, answers the question fwd-peers' does with the peers this record
has (torch SDPA's cuDNN and FA2 backends), and is not drawn when a fwd-peers record supersedes
it (plot.py decides)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from plots.common import Figure, finish, fmt, geomean, md_table, new_figure, provenance, seq_axis
from plots.names import CUDNN, FLASH, INTERNAL_RECIPES, style, system_name

# fp4attn recipes the figure draws, in this order, at most four (with the two peers: six lines).
FIGURE_RECIPES = ("fp8", "nvfp4", "nvfp4-fast", "fp4-direct")


def by_peer(doc: dict, peer: str) -> dict:
    """{(recipe, d, causal, s): record} of the merged records against `peer`."""
    return {
        (r["recipe"], r["d"], r["causal"], r["s_q"]): r
        for r in doc.get("records", [])
        if r.get("peer") == peer
    }


def recipes(doc: dict) -> list[str]:
    return list(OrderedDict.fromkeys(r["recipe"] for r in doc.get("records", [])))


def markdown(doc: dict) -> str:
    cud, fa2 = by_peer(doc, CUDNN), by_peer(doc, FLASH)
    lines = []
    if doc.get("sm_clock_mhz") is not None:
        lines.append(
            f"SM clock under load (clock64 spin after each point): ours "
            f"{fmt(doc.get('sm_clock_mhz'), 4)} MHz (min "
            f"{fmt(doc.get('sm_clock_min_mhz'), 4)}, peak "
            f"{fmt(doc.get('sm_clock_peak_mhz'), 4)}), peers "
            f"{fmt(doc.get('peer_sm_clock_mhz'), 4)} MHz.\n"
        )
    lines.append(
        "TFLOP/s = 4·b·h·s²·d (halved for causal) / median kernel time (quantization "
        "apart: quant ms, Q+K+V); × = peer ms / our ms; target: issue 4's bar against "
        "cuDNN BF16; cos and rel-L2 against float64 on 256 sampled rows of one (batch, "
        "head).\n"
    )
    header = [
        "d",
        "causal",
        "s",
        "b x h",
        "ms",
        "TFLOP/s",
        "cuDNN TFLOP/s",
        "× cuDNN",
        "target",
        "FA2 TFLOP/s",
        "× FA2",
        "quant ms",
        "cos",
        "rel-L2",
    ]
    errors = []
    for recipe in recipes(doc):
        rows = []
        for k in sorted(k for k in cud if k[0] == recipe):
            r, f = cud[k], fa2.get(k, {})
            if "error" in r:
                errors.append(f"* {recipe} {r['case']}: {r['error']}")
                rows.append(
                    [r["d"], fmt(r["causal"]), r["s_q"], f"{r['b']} x {r['h']}", "error"]
                    + [""] * (len(header) - 5)
                )
                continue
            mark = "" if r.get("meets_target") is None else " ✓" if r["meets_target"] else " ✗"
            rows.append(
                [
                    r["d"],
                    fmt(r["causal"]),
                    r["s_q"],
                    f"{r['b']} x {r['h']}",
                    fmt(r.get("ms"), 4),
                    fmt(r.get("tflops"), 4),
                    fmt(r.get("peer_tflops"), 4),
                    fmt(r.get("speedup"), 3) + mark,
                    fmt(r.get("target_speedup"), 3),
                    fmt(f.get("peer_tflops"), 4),
                    fmt(f.get("speedup"), 3),
                    fmt(r.get("quant_ms"), 3),
                    fmt(r.get("cos"), 7),
                    fmt(r.get("rel_l2"), 3),
                ]
            )
        lines += [f"### {recipe}", "", md_table(header, rows), ""]
        summ = (doc.get("summary") or {}).get(recipe)
        if summ:
            lines += [
                (
                    f"{summ['meets_target']} of {summ['points']} points meet the target; "
                    f"speedup over cuDNN BF16 min {fmt(summ.get('min_speedup'), 3)}, "
                    f"geometric mean {fmt(summ.get('geomean_speedup'), 3)}."
                ),
                "",
            ]
    acc = doc.get("accuracy") or []
    if acc:
        rows = []
        for a in acc:
            who = a.get("peer") or f"fp4attn {a.get('recipe')}"
            where = (
                f"{a['slices_compared']} of {a['slices_total']} (batch, head) slices"
                if "slices_compared" in a
                else a.get("reference", "")
            )
            rows.append(
                [
                    a.get("case"),
                    who,
                    "error: " + a["error"] if "error" in a else fmt(a.get("cos"), 7),
                    fmt(a.get("rel_l2"), 4),
                    where,
                ]
            )
        lines += [
            "### Accuracy at FA3's comparison shape (b=8, h=16, s=2048, d=128, N(0,1))",
            "",
            "Full output against float64; FlashAttention-3 FP8: cos 0.9986, rel-L2 0.053.",
            "",
            md_table(["case", "kernel", "cos", "rel-L2", "compared"], rows),
            "",
        ]
    for w in doc.get("warnings", []):
        errors.append(f"* warning: {w}")
    if errors:
        lines += ["Errors and warnings:", ""] + errors[:30]
    return "\n".join(lines)


def draw(plt: Any, doc: dict, source: str) -> Any:
    cud, fa2 = by_peer(doc, CUDNN), by_peer(doc, FLASH)
    dims = sorted({k[1] for k in cud})
    d = 128 if 128 in dims else max(dims)
    seqs = sorted({k[3] for k in cud if k[1] == d})
    drawn = [r for r in FIGURE_RECIPES if r in recipes(doc)]
    fig, axes = new_figure(plt, 2)
    for ax, causal in zip(axes, (False, True)):
        # The peers' TFLOP/s are the same in every recipe's records: take fp8's (the first).
        any_recipe = drawn[0] if drawn else recipes(doc)[0]
        for peer, table in ((CUDNN, cud), (FLASH, fa2)):
            pts = [
                (s, r["peer_tflops"])
                for s in seqs
                if (r := table.get((any_recipe, d, causal, s))) and "peer_tflops" in r
            ]
            if pts:
                ax.plot(*zip(*pts), label=system_name(peer), **style(peer))
        for recipe in drawn:
            pts = [
                (s, r["tflops"])
                for s in seqs
                if (r := cud.get((recipe, d, causal, s))) and "tflops" in r
            ]
            if pts:
                ax.plot(
                    *zip(*pts), label=system_name("fp4attn", recipe), **style("fp4attn", recipe)
                )
        seq_axis(ax, seqs, "sequence length s (tokens; b = 16384 / s)")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{'causal' if causal else 'full (non-causal)'}: d = {d}", fontsize=10)
    means = sorted(
        (
            (
                geomean(
                    r["speedup"]
                    for k, r in cud.items()
                    if k[0] == recipe and k[1] == d and k[3] >= 4096 and "speedup" in r
                ),
                recipe,
            )
            for recipe in drawn
        ),
        key=lambda m: -(m[0] or 0),
    )
    subtitle = "fp4attn × cuDNN BF16, geometric mean over s ≥ 4k, both masks: " + ", ".join(
        f"{r} {m:.2f}×" for m, r in means if m is not None
    )
    others = [r for r in recipes(doc) if r not in drawn and r not in INTERNAL_RECIPES]
    caption = (
        f"{provenance(doc, source)} TFLOP/s = 4·b·h·s²·d (halved for causal) / time. "
        f"fp4attn: kernel time only, operands quantized "
        f"beforehand; peers: torch SDPA BF16 in the same run; CUDA events, median. "
        f"SM clock under load {fmt(doc.get('sm_clock_mhz'), 4)} MHz."
    )
    if others:
        caption += f" Not drawn: {', '.join(others)} (fwd.md has every recipe)."
    return finish(
        fig,
        f"Forward kernels at d = {d}: how fast is each fp4attn recipe against torch SDPA BF16?",
        subtitle,
        caption,
        axes,
    )


def figures(doc: dict, source: str) -> list[Figure]:
    if not by_peer(doc, CUDNN):
        return []
    return [Figure("fwd.png", lambda plt: draw(plt, doc, source))]
