"""Any other suite: a table of the usual record fields and a bar chart of its TFLOP/s or TB/s per
case (records whose suite has no module of its own)."""

from __future__ import annotations

from typing import Any

from plots.common import Figure, finish, fmt, md_table, provenance

FIELDS = (
    "case",
    "path",
    "kind",
    "recipe",
    "peer",
    "system",
    "b",
    "h",
    "h_kv",
    "s_q",
    "s_k",
    "d",
    "causal",
    "ms",
    "median_ms",
    "tflops",
    "tbps",
    "efficiency",
    "peer_ms",
    "speedup",
    "cos",
    "rel_l2",
    "error",
)
METRICS = {"tflops": "TFLOP/s", "tbps": "TB/s"}


def markdown(doc: dict) -> str:
    recs = doc.get("records", [])
    fields = [f for f in FIELDS if any(f in r for r in recs)]
    return md_table(fields, [[fmt(r.get(f), 4) for f in fields] for r in recs])


def metric(doc: dict) -> str | None:
    recs = doc.get("records", [])
    return next((m for m in METRICS if any(m in r for r in recs)), None)


def draw(plt: Any, doc: dict, source: str, key: str) -> Any:
    pts = [
        (" ".join(str(r[f]) for f in ("case", "path", "recipe") if r.get(f)), r[key])
        for r in doc.get("records", [])
        if key in r
    ]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.4 * len(pts) + 2), 7.5))
    ax.bar(range(len(pts)), [v for _, v in pts], color="tab:blue")
    ax.set_xticks(range(len(pts)), [n for n, _ in pts], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel(METRICS[key])
    ax.grid(True, axis="y", alpha=0.3)
    return finish(
        fig,
        f"{doc.get('suite')}: {METRICS[key]} per case",
        "every record of the file; the table beside has the other fields",
        provenance(doc, source),
        [ax],
    )


def figures(doc: dict, source: str) -> list[Figure]:
    key = metric(doc)
    if key is None:
        return []
    return [Figure(None, lambda plt: draw(plt, doc, source, key))]
