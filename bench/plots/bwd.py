"""The bwd record (bench/bwd_peers.py): fp4attn's forward + backward through autograd against
torch SDPA BF16 (cuDNN and FA2 backends). Its figure, bwd.png: fwd+bwd TFLOP/s against the
sequence length, quantization included."""

from __future__ import annotations

from typing import Any

from plots.common import (
    Figure,
    finish,
    fmt,
    fmt_tokens,
    geomean,
    md_table,
    new_figure,
    provenance,
    sentence,
    seq_axis,
)
from plots.names import CUDNN, FLASH, style, system_name

KIND = "fwd+bwd"
KIND_WORDS = {
    "fwd+bwd": "forward + backward, quantization included",
    "fwd+bwd-noquant": "forward + backward on operands quantized beforehand",
    "bwd": "backward alone",
}


def ours(doc: dict, kind: str) -> dict[str, list[dict]]:
    """{recipe: [record]} against cuDNN (each record also has an FA2 twin), sorted by s."""
    out: dict[str, list[dict]] = {}
    for r in doc.get("records", []):
        if r.get("kind") == kind and r.get("peer") == CUDNN and "tflops" in r:
            out.setdefault(r["recipe"], []).append(r)
    for recs in out.values():
        recs.sort(key=lambda r: r["s_q"])
    return out


def peer_points(doc: dict, kind: str, peer: str) -> list[tuple[int, float]]:
    return sorted(
        (p["s_q"], p["tflops"])
        for p in doc.get("peers", [])
        if p.get("kind") == kind and p.get("peer") == peer and "tflops" in p
    )


def shape_words(doc: dict) -> str:
    r = next(iter(doc.get("records", [])), {})
    mask = "causal" if r.get("causal") else "full"
    cfg = doc.get("config") or {}
    return (
        f"d = {r.get('d', '?')}, h = {r.get('h', '?')}, {mask}, {cfg.get('tokens', '?')} "
        f"tokens per point (b = tokens / s)"
    )


def draw(plt: Any, doc: dict, source: str) -> Any:
    fig, (ax,) = new_figure(plt, 1, width=9.0)
    for peer in (CUDNN, FLASH):
        pts = peer_points(doc, KIND, peer)
        if pts:
            ax.plot(*zip(*pts), label=system_name(peer), **style(peer))
    recs_by = ours(doc, KIND)
    for recipe, recs in recs_by.items():
        ax.plot(
            [r["s_q"] for r in recs],
            [r["tflops"] for r in recs],
            label=system_name("fp4attn", recipe),
            **style("fp4attn", recipe),
        )
    seqs = sorted({r["s_q"] for recs in recs_by.values() for r in recs})
    seq_axis(ax, seqs, "sequence length s (tokens)")
    ax.set_ylabel("TFLOP/s (forward + backward)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    means = sorted(
        ((geomean(r["speedup"] for r in recs), recipe) for recipe, recs in recs_by.items()),
        key=lambda m: -(m[0] or 0),
    )
    subtitle = "fp4attn × cuDNN BF16, geometric mean over the lengths: " + ", ".join(
        f"{r} {m:.2f}×" for m, r in means if m is not None
    )
    caption = (
        f"{provenance(doc, source)} TFLOP/s = 3.5 × the forward's 4·b·h·s²·d (halved "
        f"for causal) / time. {sentence(KIND_WORDS[KIND])}: one forward and "
        f"o.backward(dO) per sample, {shape_words(doc)}; fp4attn through autograd "
        f"(d_source {(doc.get('config') or {}).get('d_source', '?')}), the peers torch "
        "SDPA BF16 in the same run; CUDA events, median."
    )
    return finish(
        fig,
        "Forward + backward: how fast is fp4attn against torch SDPA BF16?",
        subtitle,
        caption,
        [ax],
        ncol=3,
    )


def figures(doc: dict, source: str) -> list[Figure]:
    if not ours(doc, KIND):
        return []
    return [Figure("bwd.png", lambda plt: draw(plt, doc, source))]


def markdown(doc: dict) -> str:
    lines = [
        (
            f"TFLOP/s: {doc.get('flops_convention', 'see the record')}; × = peer time / ours, "
            "the same point and run."
        ),
        "",
    ]
    for kind, words in KIND_WORDS.items():
        recs_by = ours(doc, kind)
        if not recs_by:
            continue
        seqs = sorted({r["s_q"] for recs in recs_by.values() for r in recs})
        cud = dict(peer_points(doc, kind, CUDNN))
        fa2 = dict(peer_points(doc, kind, FLASH))
        header = ["s", "cuDNN BF16 TFLOP/s", "FA2 BF16 TFLOP/s"] + [
            f"{rec} TFLOP/s (× cuDNN)" for rec in recs_by
        ]
        rows = []
        for s in seqs:
            row = [fmt_tokens(s), fmt(cud.get(s), 4), fmt(fa2.get(s), 4)]
            for recs in recs_by.values():
                r = next((r for r in recs if r["s_q"] == s), None)
                row.append("-" if r is None else f"{fmt(r['tflops'], 4)} ({r['speedup']:.2f}×)")
            rows.append(row)
        lines += [f"### {kind}: {words}", "", md_table(header, rows), ""]
    acc = doc.get("accuracy") or []
    if acc:
        rows = [
            [
                a.get("peer") or f"fp4attn {a.get('recipe')}",
                *(
                    f"{a[g]['cos']:.5f} / {a[g]['rel_l2']:.4f}" if g in a else "-"
                    for g in ("o", "dq", "dk", "dv")
                ),
            ]
            for a in acc
        ]
        lines += [
            f"### Gradients against float64 ({acc[0].get('case', '')})",
            "",
            md_table(["system", "O", "dQ", "dK", "dV"], rows),
            "",
        ]
    return "\n".join(lines)
