#!/usr/bin/env python3
"""Turns benchmark suite JSON (docs/design.md's record schema) into Markdown tables and figures.

    python3 bench/plot.py FILE.json [FILE.json ...] [--out-dir DIR] [--markdown FILE] [--no-png]

For each FILE.json it writes FILE.md beside it (or in --out-dir) and the suite's figures; --markdown
FILE writes all the tables into that one file instead. The tables are also printed. The figures
need matplotlib: without it they are skipped with a message, the tables are still written.

Figures, one per question (bench/plots/, one module per suite):
  fwd-peers (bench/side_by_side_record.py): fwd.png, the forward kernels at d = 128 against
      cuDNN BF16, FlashAttention-3 FP8 and SageAttention2; fwd-e2e.png, the same from BF16 inputs.
  fwd (bench/fwd_record.py): fwd.png with the peers that record has (torch SDPA cuDNN and FA2),
      not drawn when a fwd-peers record is given too or lies in the output folder.
  decode: decode.png, bandwidth and speedup over cuDNN BF16 of the API in a CUDA graph.
  bwd: bwd.png, forward + backward against torch SDPA BF16.
  quantize: quantize.png, each quantizer's fraction of the copy bandwidth at the largest size.
  peers: table only (fwd.png supersedes its figure).
Any other suite: a table of the usual record fields and a bar chart of TFLOP/s or TB/s per case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # bench/plots/: one module per suite
from plots.common import header_md

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A figure of one suite that another suite's record draws better, when that record is at hand.
SUPERSEDED = {("fwd", "fwd.png"): "fwd-peers"}


def load_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def source_name(path: str) -> str:
    """The record's path as the captions cite it: relative to the repository when inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else os.path.basename(path)


def superseded(suite: str, name: str, out_dir: str, suites_given: set[str]) -> str | None:
    """The suite whose record supersedes this figure, when its record is given or in out_dir."""
    better = SUPERSEDED.get((suite, name))
    if better is None:
        return None
    if better in suites_given:
        return better
    try:
        with open(os.path.join(out_dir, f"{better}.json")) as f:
            return better if json.load(f).get("suite") == better else None
    except (OSError, json.JSONDecodeError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="suite JSON files")
    ap.add_argument("--out-dir", help="where the .md/.png go (default: beside each JSON)")
    ap.add_argument("--markdown", help="write every table into this one file")
    ap.add_argument("--no-png", action="store_true", help="tables only")
    args = ap.parse_args(argv)

    plt = None if args.no_png else load_pyplot()
    if plt is None and not args.no_png:
        print("plot.py: matplotlib is not installed, PNG plots skipped", file=sys.stderr)
    docs, status = [], 0
    for path in args.json:
        try:
            with open(path) as f:
                docs.append((path, json.load(f)))
        except (OSError, json.JSONDecodeError) as e:
            print(f"plot.py: cannot read {path}: {e}", file=sys.stderr)
            status = 1
    suites_given = {doc.get("suite") for _, doc in docs}
    tables = []
    for path, doc in docs:
        module = plots.module_for(doc)
        stem = os.path.splitext(os.path.basename(path))[0]
        out_dir = args.out_dir or os.path.dirname(os.path.abspath(path))
        try:
            table = header_md(doc) + "\n" + module.markdown(doc) + "\n"
            figs = module.figures(doc, source_name(path)) if doc.get("records") else []
        except (KeyError, TypeError, ValueError) as e:
            print(
                f"plot.py: {path}: not a {doc.get('suite')!r} record this script reads: "
                f"{type(e).__name__}: {e}",
                file=sys.stderr,
            )
            status = 1
            continue
        tables.append(table)
        print(table)
        os.makedirs(out_dir, exist_ok=True)
        if not args.markdown:
            with open(os.path.join(out_dir, stem + ".md"), "w") as f:
                f.write(table)
        for fig in figs if plt is not None else []:
            name = fig.name or stem + ".png"
            better = superseded(str(doc.get("suite")), name, out_dir, suites_given)
            if better:
                print(f"plot.py: {path}: {name} not drawn, the {better} record draws it")
                continue
            png = os.path.join(out_dir, name)
            fig.draw(plt).savefig(png, dpi=110)
            plt.close("all")
            print(f"wrote {png}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(tables))
        print(f"wrote {args.markdown}")
    return status


if __name__ == "__main__":
    sys.exit(main())
