"""The fwd-peers record (fp4attn's forward beside cuDNN BF16, FlashAttention-3 and SageAttention2):
its Markdown tables and two figures, fwd.png (kernels: operands quantized beforehand) and
fwd-e2e.png (BF16 in, quantization included), both at d = 128."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plots.common import (
    Figure,
    finish,
    fmt,
    fmt_tokens,
    md_table,
    new_figure,
    provenance,
    sentence,
    seq_axis,
)
from plots.fwd_peers_data import CUDNN_SERIES, FA3_SHAPE, FwdPeers, Series
from plots.names import short_name, style, system_name

KERNEL_SERIES = (
    CUDNN_SERIES,
    Series("fa3-fp8", None, "kernel"),
    Series("sage2", None, "kernel"),
    Series("fp4attn", "fp8", "kernel"),
    Series("fp4attn", "fp8-fast", "kernel"),
)
E2E_SERIES = (
    CUDNN_SERIES,
    Series("fa3-bf16", None, "e2e"),
    Series("fa3-fp8", None, "e2e"),
    Series("sage2", None, "e2e"),
    Series("fp4attn", "fp8", "e2e"),
    Series("fp4attn", "fp8-fast", "e2e"),
)
PATH_WORDS = {
    "kernel": (
        "kernel: operands quantized beforehand (FlashAttention-3 FP8 on E4M3 operands cast "
        "once; SageAttention2's sm90 kernel on its own INT8 Q/K and FP8 V; fp4attn's "
        "attn_quantized on quantize_qkv's operands); cuDNN BF16 as is"
    ),
    "e2e": (
        "BF16 Q, K, V in, quantization included (FlashAttention-3 FP8 after a plain cast to "
        "E4M3; SageAttention2's sageattn_qk_int8_pv_fp8_cuda_sm90; fp4attn's attn_func)"
    ),
}


def series_label(series: Series) -> str:
    return system_name(series.system, series.recipe)


def answer(data: FwdPeers, series_list: Sequence[Series], d: int) -> str:
    """The subtitle: each series' geometric mean × cuDNN over s >= 4k, fastest first."""
    means = [
        (data.speedup_geomean(s, d), series_label(s)) for s in series_list if s != CUDNN_SERIES
    ]
    means = sorted(((m, n) for m, n in means if m is not None), reverse=True)
    if not means:
        return "no point at s >= 4k measured"
    return "× cuDNN BF16, geometric mean over s ≥ 4k, both masks: " + ", ".join(
        f"{n} {m:.2f}×" for m, n in means
    )


def draw_speed(
    plt: Any, data: FwdPeers, series_list: Sequence[Series], path: str, title: str, source: str
) -> Any:
    d = data.main_dim()
    seqs = data.seqs(d)
    fig, axes = new_figure(plt, 2)
    missing = [series_label(s) for s in series_list if not data.has(s)]
    for ax, causal in zip(axes, (False, True)):
        for series in series_list:
            pts = [
                (s, r["tflops"]) for s in seqs if (r := data.get(series, d, causal, s)) is not None
            ]
            if pts:
                ax.plot(
                    *zip(*pts), label=series_label(series), **style(series.system, series.recipe)
                )
        tokens = (data.doc.get("config") or {}).get("tokens")
        seq_axis(
            ax,
            seqs,
            f"sequence length s (tokens; b = {tokens} / s)"
            if tokens
            else "sequence length s (tokens)",
        )
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        h = next((r["h"] for r in data.records if r["d"] == d), "?")
        ax.set_title(
            f"{'causal' if causal else 'full (non-causal)'}: d = {d}, h = {h}", fontsize=10
        )
    failed = [
        e
        for e in data.errors
        if e["d"] == d and Series(e["system"], e.get("recipe"), e["path"]) in series_list
    ]
    caption = (
        f"{provenance(data.doc, source)} TFLOP/s = 4·b·h·s²·d (halved for causal) / "
        f"time. {sentence(PATH_WORDS[path])}. Timing: "
        f"{(data.doc.get('config') or {}).get('timing', 'not recorded')}."
    )
    if missing:
        caption += f" Not in the record: {', '.join(missing)}."
    if failed:
        caption += (
            f" {len(failed)} measurement(s) at d = {d} failed (the record's errors); "
            "their points are missing."
        )
    return finish(fig, title, answer(data, series_list, d), caption, axes)


def figures(doc: dict, source: str) -> list[Figure]:
    data = FwdPeers(doc)
    d = data.main_dim()
    return [
        Figure(
            "fwd.png",
            lambda plt: draw_speed(
                plt,
                data,
                KERNEL_SERIES,
                "kernel",
                f"Forward kernels at d = {d}: how fast is fp4attn against FlashAttention-3 FP8 and "
                "SageAttention2?",
                source,
            ),
        ),
        Figure(
            "fwd-e2e.png",
            lambda plt: draw_speed(
                plt,
                data,
                E2E_SERIES,
                "e2e",
                f"Forward from BF16 inputs at d = {d} (quantization included): how fast is fp4attn "
                "against the peers?",
                source,
            ),
        ),
    ]


# ---- Markdown ---------------------------------------------------------------------------------


def columns(data: FwdPeers, path: str) -> list[Series]:
    peers = (
        [Series("fa3-fp8", None, "kernel"), Series("sage2", None, "kernel")]
        if path == "kernel"
        else [
            Series("fa3-bf16", None, "e2e"),
            Series("fa3-fp8", None, "e2e"),
            Series("sage2", None, "e2e"),
        ]
    )
    ours = [Series("fp4attn", r, path) for r in data.recipes()]
    return [s for s in peers + ours if data.has(s)]


def speed_table(data: FwdPeers, d: int, path: str) -> str:
    cols = columns(data, path)
    header = ["mask", "s", "b × h", "cuDNN BF16 TFLOP/s"] + [
        f"{short_name(c.system, c.recipe)} TFLOP/s (×)" for c in cols
    ]
    rows = []
    for causal in (False, True):
        for s in data.seqs(d):
            base = data.get(CUDNN_SERIES, d, causal, s)
            if base is None:
                continue
            row = [
                "causal" if causal else "full",
                fmt_tokens(s),
                f"{base['b']} × {base['h']}",
                fmt(base["tflops"], 4),
            ]
            for c in cols:
                r = data.get(c, d, causal, s)
                row.append("-" if r is None else f"{fmt(r['tflops'], 4)} ({r['speedup']:.2f}×)")
            rows.append(row)
    return md_table(header, rows)


def accuracy_table(data: FwdPeers) -> str:
    points = sorted(
        {(r["d"], r["causal"], r["s_q"]) for r in data.records if "cos" in r},
        key=lambda p: (-p[0], p[1], p[2]),
    )
    systems = list(
        dict.fromkeys((r["system"], r.get("recipe")) for r in data.records if "cos" in r)
    )
    header = ["system"] + [
        f"d {d}, {'causal' if c else 'full'}, s {fmt_tokens(s)}" for d, c, s in points
    ]
    rows = []
    for system, recipe in systems:
        row = [system_name(system, recipe)]
        for d, c, s in points:
            r = data.accuracy(system, recipe, d, c, s)
            row.append("-" if r is None else f"{r['cos']:.5f} / {r['rel_l2']:.4f}")
        rows.append(row)
    return md_table(header, rows)


def markdown(doc: dict) -> str:
    data = FwdPeers(doc)
    lines = [
        (
            "TFLOP/s = 4·b·h·s²·d (halved for causal) / median time; × = cuDNN BF16 time / this "
            "time, the same point and run."
        ),
        "",
        f"* kernel: {PATH_WORDS['kernel']}.",
        f"* e2e: {PATH_WORDS['e2e']}.",
        "",
    ]
    for d in sorted(data.dims(), reverse=True):
        for path in ("kernel", "e2e"):
            lines += [f"### d = {d}, {path}", "", speed_table(data, d, path), ""]
    if any("cos" in r for r in data.records):
        lines += [
            "### Accuracy (cos / rel-L2 of O against float64 SDPA)",
            "",
            (
                f"FlashAttention-3's FP8 comparison shape is d = {FA3_SHAPE['d']}, s = "
                f"{fmt_tokens(FA3_SHAPE['s'])}, full, b = 8, h = 16."
            ),
            "",
            accuracy_table(data),
            "",
        ]
    if data.errors:
        lines += ["### Errors", ""] + [
            f"* {system_name(e['system'], e.get('recipe'))} {e['path']}, d = {e['d']}, "
            f"{'causal' if e['causal'] else 'full'}, s = {fmt_tokens(e['s_q'])}: {e['error']}"
            for e in data.errors
        ]
    return "\n".join(lines)
