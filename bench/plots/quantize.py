"""The quantize record (fp4attn_bench quantize): every GPU quantizer's TB/s and its fraction of
the device copy of the same run, per input size. Its figure, quantize.png: that fraction per
quantizer at the largest size measured (where a memory-bound kernel should sit at the copy rate)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from plots.common import Figure, finish, fmt, fmt_bytes, md_table, provenance

TARGET = 0.8
LAYOUTS = {
    "rowmajor": "row-major scales",
    "swizzled": "128x4 scales",
    "4over6": "Four-Over-Six scales",
    "smooth": "smoothed",
}


def case_name(case: str, global_scale: str | None) -> str:
    """ "packed-nvfp4-swizzled" -> "packed NVFP4, 128x4 scales"; "operand-k-nvfp4-smooth" ->
    "K operand of nvfp4, smoothed"; the global scale when it is computed on the device."""
    parts = case.split("-")
    if parts[0] == "packed" and len(parts) >= 3:
        name = f"packed {parts[1].upper()}, " + LAYOUTS.get("-".join(parts[2:]), parts[2])
    elif parts[0] == "operand" and len(parts) >= 3:
        rest = parts[2:]
        extra = [LAYOUTS[p] for p in rest if p in LAYOUTS]
        recipe = "-".join(p for p in rest if p not in LAYOUTS)
        name = f"{parts[1].upper()} operand of {recipe}" + "".join(f", {e}" for e in extra)
    else:
        name = case.replace("-", " ")
    return name + (", global scale computed" if global_scale == "computed" else "")


def series(doc: dict) -> OrderedDict:
    """{(case, global scale): [(bytes, record)]} in the records' order."""
    out: OrderedDict = OrderedDict()
    for r in doc.get("records", []):
        out.setdefault((r["case"], r.get("global_scale")), []).append((r["bytes"], r))
    return out


def markdown(doc: dict) -> str:
    sizes = sorted(
        {c["bytes"] for c in doc.get("copy", [])} | {r["bytes"] for r in doc.get("records", [])}
    )
    header = ["case", "global scale"] + [fmt_bytes(b) for b in sizes]
    rows = []
    copies = {c["bytes"]: c for c in doc.get("copy", [])}
    for key, name in (("memcpy_tbps", "copy (cudaMemcpyAsync)"), ("kernel_tbps", "copy (kernel)")):
        rows.append([name, "-"] + [fmt(copies[b][key], 4) if b in copies else "" for b in sizes])
    for points in series(doc).values():
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
    errors = [
        f"* {r['case']} [{r.get('global_scale')}] at {fmt_bytes(r['bytes'])}: {r['error']}"
        for r in doc.get("records", [])
        if "error" in r
    ]
    text = (
        "TB/s = (bytes read + bytes written) / median time; in parentheses the efficiency, "
        "TB/s / copy_tbps of the same run.\n\n" + md_table(header, rows)
    )
    if errors:
        text += "\n\nErrors:\n" + "\n".join(errors[:20])
    return text


def draw(plt: Any, doc: dict, source: str) -> Any:
    largest = max(r["bytes"] for r in doc["records"])
    bars = [
        (case_name(case, scale), r)
        for (case, scale), pts in series(doc).items()
        for b, r in pts
        if b == largest and "efficiency" in r
    ]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 3.6))
    ys = list(range(len(bars)))[::-1]
    colors = ["tab:blue" if r["efficiency"] >= TARGET else "tab:orange" for _, r in bars]
    ax.barh(ys, [100 * r["efficiency"] for _, r in bars], color=colors)
    for y, (_, r) in zip(ys, bars):
        ax.text(
            100 * r["efficiency"] + 1,
            y,
            f"{100 * r['efficiency']:.0f}% ({r['tbps']:.2f} TB/s)",
            va="center",
            fontsize=7.5,
        )
    ax.set_yticks(ys, [n for n, _ in bars], fontsize=8)
    ax.axvline(
        100 * TARGET,
        color="firebrick",
        ls=":",
        lw=1.2,
        label=f"target {100 * TARGET:.0f}% of the copy",
    )
    ax.set_xlim(0, max(100, max(100 * r["efficiency"] for _, r in bars)) + 22)
    ax.set_xlabel("% of the device copy's TB/s (bytes read + written / time, same run)")
    ax.grid(True, axis="x", alpha=0.3)
    copy = (doc.get("ceilings") or {}).get("copy_tbps")
    met = sum(r["efficiency"] >= TARGET for _, r in bars)
    caption = (
        f"{provenance(doc, source)} BF16 input of {fmt_bytes(largest)}, BSHD, h = 16, "
        f"d = 128; device copy: the better of cudaMemcpyAsync and a vectorized copy "
        f"kernel ({fmt(copy, 4)} TB/s). Every size is in the table beside (quantize.md)."
    )
    return finish(
        fig,
        f"Quantizers at {fmt_bytes(largest)}: how close to the copy bandwidth?",
        f"{met} of {len(bars)} reach {100 * TARGET:.0f}% of the device copy ({fmt(copy, 4)} TB/s)",
        caption,
        [ax],
        ncol=1,
    )


def figures(doc: dict, source: str) -> list[Figure]:
    if not any("efficiency" in r for r in doc.get("records", [])):
        return []
    return [Figure("quantize.png", lambda plt: draw(plt, doc, source))]
