"""A generated section of a Markdown file between two markers, written, checked or printed: the
common part of bench/scripts/perf-table and bench/scripts/recipe-table."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_section(text: str, name: str, body: str, where: str = "the README") -> str:
    """text with what lies between the `name` markers replaced by body (one newline each side)."""
    begin, end = markers(name)
    b = text.find(begin)
    e = text.find(end, b + len(begin)) if b >= 0 else -1
    if b < 0 or e < 0:
        raise ValueError(f"{where} has no {begin} ... {end} section")
    if text.count(begin) > 1:
        raise ValueError(f"{where} has {begin} more than once")
    return text[: b + len(begin)] + "\n" + body + "\n" + text[e:]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--readme",
        default=os.path.join(ROOT, "README.md"),
        help="the Markdown file whose section is rewritten (default: README.md)",
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the section is not what the record gives (writes nothing)",
    )
    mode.add_argument("--print", action="store_true", help="print the section only")


def run(tool: str, name: str, args: argparse.Namespace, body_for: Callable[[str], str]) -> int:
    """Writes (or checks, or prints) the `name` section of args.readme; body_for gets the
    directory of the README, for the links the section makes relative to it."""
    readme_dir = os.path.dirname(os.path.abspath(args.readme))
    try:
        body = body_for(readme_dir)
    except (OSError, KeyError, TypeError, ValueError) as e:
        print(f"{tool}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.print:
        print(body)
        return 0
    try:
        with open(args.readme) as f:
            text = f.read()
        new = replace_section(text, name, body, args.readme)
    except (OSError, ValueError) as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(
                f"{tool}: the {name} section of {args.readme} is stale; run bench/scripts/{tool}",
                file=sys.stderr,
            )
            return 1
        print(f"{tool}: {args.readme} up to date")
        return 0
    if new != text:
        with open(args.readme, "w") as f:
            f.write(new)
        print(f"{tool}: rewrote the {name} section of {args.readme}")
    else:
        print(f"{tool}: {args.readme} already up to date")
    return 0


def link(path: str, readme_dir: str) -> str:
    """A Markdown link to path, relative to the README's directory."""
    rel = os.path.relpath(os.path.abspath(path), readme_dir)
    return f"[{rel}]({rel})"
