"""The decode record (bench/decode_peers.py --merge): one query token against a paged KV cache,
fp4attn's NVFP4 and FP8 caches against SDPA cuDNN BF16 on a contiguous BF16 cache. Its figure,
decode.png, is the API path in a CUDA graph (what a serving loop runs): the bandwidth each one
draws from HBM and its speedup over cuDNN BF16, against the tokens in the cache."""

from __future__ import annotations

from typing import Any

from plots.common import Figure, finish, fmt, fmt_tokens, geomean, md_table, new_figure, provenance
from plots.names import CUDNN, style, system_name

PATH = "api-graph"
RECIPES = ("nvfp4", "fp8")
# The datasheet's HBM3e bandwidth, where the record's device is one we know.
HBM_PEAK_TBPS = {"H200": 4.8, "H100": 3.35}
PATH_WORDS = {
    "kernel": "the decode kernel alone (fp4attn_bench)",
    "api": "fp4attn.DecodePlan.run from Python, eager",
    "api-graph": "fp4attn.DecodePlan.run captured in a CUDA graph and replayed",
}


def hbm_peak(device: str) -> float | None:
    return next((v for k, v in HBM_PEAK_TBPS.items() if k in device), None)


def graph_points(doc: dict) -> tuple[dict, dict]:
    """({recipe: [record]}, {case: peer record}) of the single-token API-in-a-graph points,
    ordered by tokens in the cache (b · L), then b."""
    ours: dict[str, list[dict]] = {r: [] for r in RECIPES}
    for r in doc.get("records", []):
        if r.get("path") == PATH and r.get("s_q", 1) == 1 and r["recipe"] in ours:
            ours[r["recipe"]].append(r)
    for recs in ours.values():
        recs.sort(key=lambda r: (r["b"] * r["s_k"], r["b"]))
    peers = {
        p["case"]: p
        for p in doc.get("peers", [])
        if p.get("path") == PATH and p.get("system") == CUDNN and p.get("s_q", 1) == 1
    }
    return ours, peers


def shape_words(doc: dict) -> str:
    r = next((r for r in doc.get("records", []) if "h" in r and "d" in r), {})
    return f"h = {r.get('h', '?')} query / {r.get('h_kv', '?')} KV heads, d = {r.get('d', '?')}"


def fewer_bytes(ours: dict, peers: dict) -> str:
    """ ", so fp4attn reads 1.9-3.5x fewer bytes ...": the range over the points drawn."""
    ratios = [
        peers[r["case"]]["bytes"] / r["bytes"]
        for recs in ours.values()
        for r in recs
        if r["case"] in peers and r.get("bytes")
    ]
    if not ratios:
        return ""
    return (
        f": fp4attn reads {min(ratios):.1f}-{max(ratios):.1f}x fewer bytes, so a lower TB/s "
        "can still be faster"
    )


def scatter_with_mean(ax: Any, pts: list[tuple[int, float]], label: str, kw: dict) -> None:
    """Every point as a marker (several batch sizes share a b · L) and a line through the mean
    at each b · L."""
    by_x: dict[int, list[float]] = {}
    for x, y in pts:
        by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    line = {k: v for k, v in kw.items() if k not in ("marker", "mfc")}
    ax.plot(xs, [sum(by_x[x]) / len(by_x[x]) for x in xs], alpha=0.6, **{**line, "lw": 1.2})
    ax.plot(
        *zip(*pts),
        ls="none",
        marker=kw.get("marker", "o"),
        color=kw.get("color"),
        mfc=kw.get("mfc", kw.get("color")),
    )
    ax.plot([], [], label=label, **kw)  # the legend's entry: marker and line


def draw(plt: Any, doc: dict, source: str) -> Any:
    ours, peers = graph_points(doc)
    fig, (ax_bw, ax_x) = new_figure(plt, 2)
    ceil = doc.get("ceilings") or {}
    peer_pts = [(p["b"] * p["s_k"], p["tbps"]) for p in peers.values()]
    if peer_pts:
        scatter_with_mean(ax_bw, peer_pts, system_name(CUDNN) + ", BF16 cache", style(CUDNN))
    for recipe, recs in ours.items():
        if not recs:
            continue
        kw = style("fp4attn", recipe)
        label = f"fp4attn, {recipe.upper()} cache"
        scatter_with_mean(ax_bw, [(r["b"] * r["s_k"], r["tbps"]) for r in recs], label, kw)
        scatter_with_mean(ax_x, [(r["b"] * r["s_k"], r["speedup"]) for r in recs], label, kw)
    peak = hbm_peak(str(doc.get("device", "")))
    if peak:
        ax_bw.axhline(
            peak, color="firebrick", ls=":", lw=1.2, label=f"HBM peak {peak:g} TB/s (datasheet)"
        )
    if ceil.get("read_tbps"):
        ax_bw.axhline(
            ceil["read_tbps"],
            color="0.35",
            ls="-.",
            lw=1.2,
            label=f"measured read ceiling {ceil['read_tbps']:.2f} TB/s",
        )
    ax_x.axhline(1.0, color="black", ls="--", lw=1.0)
    ticks = sorted({r["b"] * r["s_k"] for recs in ours.values() for r in recs})
    for ax in (ax_bw, ax_x):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [fmt_tokens(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("tokens in the cache, b · L (batch × context length)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    if peak:
        ax_bw.set_ylim(0, peak * 1.08)
    ax_bw.set_ylabel("TB/s (bytes a call must read / time)")
    ax_bw.set_title("bandwidth drawn from HBM", fontsize=10)
    ax_x.set_ylabel("speedup over cuDNN BF16 (its time / fp4attn's)")
    ax_x.set_title("speedup over cuDNN BF16 (dashed: 1×)", fontsize=10)
    big = {
        rec: geomean(r["speedup"] for r in recs if r["b"] * r["s_k"] >= 65536)
        for rec, recs in ours.items()
    }
    subtitle = "× cuDNN BF16, geometric mean from b · L = 64k tokens up: " + ", ".join(
        f"{rec.upper()} cache {m:.2f}×" for rec, m in big.items() if m
    )
    batches = sorted({r["b"] for recs in ours.values() for r in recs})
    caption = (
        f"{provenance(doc, source)} Markers: every point (batch sizes that share a b · L "
        f"lie on one vertical); lines: their mean. One query token per sequence, "
        f"{shape_words(doc)}, every sequence L tokens, b ∈ {batches}; "
        f"{PATH_WORDS[PATH]}, for both fp4attn and SDPA (on a contiguous BF16 cache). Bytes "
        "read: fp4attn the quantized cache (codes and scales), q, block table and "
        f"lengths; SDPA the BF16 K and V and q{fewer_bytes(ours, peers)}. Timing: "
        f"{(doc.get('config') or {}).get('timing', 'not recorded')}."
    )
    return finish(
        fig,
        "Decode over a paged KV cache: how much bandwidth, and how much faster than cuDNN BF16?",
        subtitle,
        caption,
        [ax_bw, ax_x],
    )


def figures(doc: dict, source: str) -> list[Figure]:
    ours, _ = graph_points(doc)
    if not any(ours.values()):
        return []
    return [Figure("decode.png", lambda plt: draw(plt, doc, source))]


def markdown(doc: dict) -> str:
    paths = list(dict.fromkeys(r.get("path", "kernel") for r in doc.get("records", [])))
    lines = [
        (
            "TB/s = bytes a call must read / median time (fp4attn: the quantized cache with its "
            "scales, q, block table and lengths; the peer: its BF16 cache); × = cuDNN BF16 time "
            "/ fp4attn's, the same point and path."
        ),
        "",
    ]
    for path in paths:
        recs = [r for r in doc.get("records", []) if r.get("path", "kernel") == path]
        cases = list(dict.fromkeys(r["case"] for r in recs))
        recipes = list(dict.fromkeys(r["recipe"] for r in recs))
        by = {(r["case"], r["recipe"]): r for r in recs}
        header = ["case", "b", "L", "s_q", "cuDNN BF16 ms"] + [
            f"{rec} ms (TB/s, ×)" for rec in recipes
        ]
        rows = []
        for case in cases:
            first = next(by[(case, rec)] for rec in recipes if (case, rec) in by)
            row = [
                case,
                first["b"],
                fmt_tokens(first["s_k"]),
                first.get("s_q", 1),
                fmt(first.get("peer_ms"), 4),
            ]
            for rec in recipes:
                r = by.get((case, rec))
                row.append(
                    "-"
                    if r is None
                    else "error"
                    if "error" in r
                    else f"{fmt(r['ms'], 4)} ({fmt(r.get('tbps'), 3)}, {fmt(r.get('speedup'), 3)}×)"
                )
            rows.append(row)
        lines += [f"### {path}: {PATH_WORDS.get(path, path)}", "", md_table(header, rows), ""]
    return "\n".join(lines)
