"""The peers record (bench/peers.py): torch SDPA BF16's cuDNN and FA2 backends on the forward grid.
Table only: fwd.png (the fwd-peers record) draws the same cuDNN BF16 beside FlashAttention-3 and
SageAttention2, the peers a user would pick, so this record has no figure of its own."""

from __future__ import annotations

from collections import OrderedDict

from plots.common import Figure, fmt, md_table


def markdown(doc: dict) -> str:
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
    return (
        "TFLOP/s = 4·b·h·s²·d (halved for causal) / median time; forward unless marked.\n\n"
        + md_table(header, rows)
    )


def figures(doc: dict, source: str) -> list[Figure]:
    return []
