"""bench/plot.py's tables and figures, one module per suite: each has markdown(doc) -> str and
figures(doc, source) -> [Figure]. Imported with bench/ on sys.path (plot.py and the table scripts
put it there)."""

from __future__ import annotations

from types import ModuleType

from plots import bwd, decode, fwd, fwd_peers, generic, peers, quantize

SUITES: dict[str, ModuleType] = {
    "quantize": quantize,
    "peers": peers,
    "fwd": fwd,
    "fwd-peers": fwd_peers,
    "decode": decode,
    "bwd": bwd,
}


def module_for(doc: dict) -> ModuleType:
    """The suite's module; a part of a merged suite (a "part" key: its records are not the
    merged schema) and any suite without a module get the generic table."""
    if doc.get("part"):
        return generic
    return SUITES.get(doc.get("suite"), generic)
