"""What every table and figure of bench/plot.py shares: number formats, Markdown tables, the
record's header, and the figure frame (a title that asks the question, a subtitle that answers it,
the legend below the axes, the record's provenance in a caption at the bottom)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Figure:
    """One PNG: its file name (None: the record's name with .png), written beside the record or
    in --out-dir, and how to draw it."""

    name: str | None
    draw: Callable[[Any], Any]  # pyplot -> matplotlib Figure


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def fmt_bytes(n: int) -> str:
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):g} MiB"
    return f"{n} B"


def fmt_tokens(n: int) -> str:
    """1024 -> 1k, 2097152 -> 2M: sequence lengths and cache sizes on axes and in tables."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}k"
    return str(n)


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def clocks_line(doc: dict) -> str:
    clocks = doc.get("clocks") or {}
    parts = []
    for when in ("before", "after"):
        c = clocks.get(when) or {}
        if c.get("sm_mhz") is not None:
            parts.append(
                f"{when} {fmt(c.get('sm_mhz'), 4)} MHz (max {fmt(c.get('max_sm_mhz'), 4)}, "
                f"{fmt(c.get('power_w'), 3)} W, {fmt(c.get('temp_c'), 2)} C)"
            )
    return "SM clock " + "; ".join(parts) if parts else "SM clock: not recorded"


def header_md(doc: dict) -> str:
    lines = [
        f"## {doc.get('suite', '?')} — {doc.get('device', '?')}",
        "",
        (
            f"revision `{doc.get('revision', '?')}`, {doc.get('date', '?')}, "
            f"command `{doc.get('command', '?')}`"
        ),
        "",
    ]
    ceil = doc.get("ceilings") or {}
    if ceil:
        lines.append(
            "ceilings: "
            + ", ".join(
                f"{k} {fmt_bytes(v) if k.endswith('_bytes') else fmt(v, 4)}"
                for k, v in ceil.items()
                if isinstance(v, (int, float))
            )
        )
    lines += [clocks_line(doc), ""]
    return "\n".join(lines)


def sentence(text: str) -> str:
    """text with its first letter upper-cased (str.capitalize lowers the rest)."""
    return text[:1].upper() + text[1:]


def provenance(doc: dict, source: str) -> str:
    """The caption's first sentence: where and when the figures were measured, and the record."""
    torch = (doc.get("software") or {}).get("torch")
    parts = [
        str(doc.get("device", "unknown device")),
        f"fp4attn revision {doc.get('revision', '?')}",
        str(doc.get("date", "undated")),
    ]
    if torch:
        parts.append(f"torch {torch}")
    return ", ".join(parts) + f". Record: {source}."


# ---- figures ----------------------------------------------------------------------------------

CAPTION_PT, SUBTITLE_PT, TITLE_PT, LEGEND_ROW_IN = 7.5, 9.5, 12.5, 0.25


def new_figure(plt: Any, ncols: int, width: float = 6.2, height: float = 4.2):
    """A figure of ncols side-by-side panels of width x height inches (the frame adds its own)."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height + 2.2), squeeze=False)
    return fig, list(axes[0])


def seq_axis(ax: Any, seqs: Sequence[int], label: str) -> None:
    """A log2 axis of sequence lengths with 1k, 2k, ... ticks."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(seqs), [fmt_tokens(s) for s in seqs])
    ax.minorticks_off()
    ax.set_xlabel(label)


def finish(
    fig: Any, title: str, subtitle: str, caption: str, legend_from: Sequence[Any], ncol: int = 3
) -> Any:
    """Title (the question) and subtitle (the answer) on top, one legend below the panels (the
    handles of every axis in legend_from, each label once), the caption at the bottom."""
    width_in, height_in = fig.get_size_inches()
    handles, labels = [], []
    for ax in legend_from:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    chars = int(width_in * 72 / (CAPTION_PT * 0.58))
    cap_lines = textwrap.wrap(caption, chars, break_long_words=False, break_on_hyphens=False)
    rows = math.ceil(len(labels) / ncol) if labels else 0
    cap_in = (len(cap_lines) + 0.8) * CAPTION_PT * 1.35 / 72
    legend_in = rows * LEGEND_ROW_IN + (0.15 if rows else 0)
    title_lines = textwrap.wrap(title, int(width_in * 72 / (TITLE_PT * 0.62)))
    sub_lines = textwrap.wrap(
        subtitle,
        int(width_in * 72 / (SUBTITLE_PT * 0.6)),
        break_long_words=False,
        break_on_hyphens=False,
    )
    title_in = 0.12 + len(title_lines) * TITLE_PT * 1.35 / 72
    bottom = (cap_in + legend_in + 0.12) / height_in
    top = 1 - (title_in + 0.15 + len(sub_lines) * SUBTITLE_PT * 1.3 / 72) / height_in
    fig.suptitle(
        "\n".join(title_lines),
        y=1 - 0.12 / height_in,
        va="top",
        fontsize=TITLE_PT,
        fontweight="bold",
    )
    fig.text(
        0.5,
        1 - (title_in + 0.08) / height_in,
        "\n".join(sub_lines),
        ha="center",
        va="top",
        fontsize=SUBTITLE_PT,
    )
    fig.tight_layout(rect=(0, bottom, 1, top), pad=0.6)
    if labels:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            ncol=ncol,
            fontsize=8.5,
            frameon=False,
            bbox_to_anchor=(0.5, (cap_in + legend_in + 0.1) / height_in),
        )
    fig.text(
        0.01,
        0.3 / height_in,
        "\n".join(cap_lines),
        ha="left",
        va="bottom",
        fontsize=CAPTION_PT,
        color="0.25",
    )
    return fig
