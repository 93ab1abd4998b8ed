"""Reads the fwd-peers record (bench/side_by_side_record.py writes it): its records by (system,
recipe, path, point), the points, and the speed summaries the figures and README tables quote."""

from __future__ import annotations

from dataclasses import dataclass

from plots.common import geomean
from plots.names import CUDNN

SUITE = "fwd-peers"
# The FlashAttention-3 paper's FP8 accuracy shape: b = 8, h = 16, s = 2048, d = 128, non-causal.
FA3_SHAPE = {"d": 128, "s": 2048, "causal": False}


@dataclass(frozen=True)
class Series:
    """One line of a figure or one column of a table: a system, its recipe, its path."""

    system: str
    recipe: str | None
    path: str


CUDNN_SERIES = Series(CUDNN, None, "e2e")


class FwdPeers:
    """The records of one fwd-peers document, looked up by series and point."""

    def __init__(self, doc: dict) -> None:
        if doc.get("suite") != SUITE:
            raise ValueError(f"expected a {SUITE} record, got suite {doc.get('suite')!r}")
        self.doc = doc
        self.records = doc.get("records", [])
        self.by = {
            (r["system"], r.get("recipe"), r["path"], r["d"], r["causal"], r["s_q"]): r
            for r in self.records
        }
        self.errors = doc.get("errors", [])

    def get(self, series: Series, d: int, causal: bool, s: int) -> dict | None:
        return self.by.get((series.system, series.recipe, series.path, d, causal, s))

    def has(self, series: Series) -> bool:
        return any(k[:3] == (series.system, series.recipe, series.path) for k in self.by)

    def dims(self) -> list[int]:
        return sorted({r["d"] for r in self.records})

    def seqs(self, d: int) -> list[int]:
        return sorted({r["s_q"] for r in self.records if r["d"] == d})

    def recipes(self) -> list[str]:
        return list(dict.fromkeys(r["recipe"] for r in self.records if r["system"] == "fp4attn"))

    def main_dim(self) -> int:
        """d = 128 when measured (the figures' and tables' headline), else the largest d."""
        dims = self.dims()
        return 128 if 128 in dims else max(dims)

    def speedup_geomean(self, series: Series, d: int, min_s: int = 4096) -> float | None:
        """Geometric mean of × cuDNN over s >= min_s, both masks (None when nothing measured)."""
        return geomean(
            r["speedup"]
            for k, r in self.by.items()
            if k[:4] == (series.system, series.recipe, series.path, d) and k[5] >= min_s
        )

    def accuracy(
        self, system: str, recipe: str | None, d: int, causal: bool, s: int
    ) -> dict | None:
        """The record of the system that carries cos / rel_l2 at the point (either path: a
        system's two paths compute the same numerics)."""
        for path in ("kernel", "e2e"):
            r = self.by.get((system, recipe, path, d, causal, s))
            if r is not None and "cos" in r:
                return r
        return None
