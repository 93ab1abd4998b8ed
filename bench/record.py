"""What every bench record shares (DESIGN.md's schema; bench/cpp/record.h writes the same head for
fp4attn_bench): the revision measured, the UTC date, the command line, the header those make, the
warnings of a merge of two parts, and the JSON file. Imports no torch, so that merges and
self-tests run anywhere.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_revision(dirty_paths=None):
    """The checkout's short revision ("unknown" without git); with dirty_paths, "-dirty" when
    those paths have local changes."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.strip()
    try:
        rev = git("rev-parse", "--short=12", "HEAD")
        if dirty_paths and git("status", "--porcelain", "--", *dirty_paths):
            rev += "-dirty"
        return rev
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def revision(arg=None, package_dir=None):
    """--revision, else $FP4ATTN_REVISION, else git, else .deps/REVISION (scripts/gpu-check
    --prepare), else the REVISION file beside an installed package (gpu-check --keep-install);
    "unknown" when none says."""
    if arg or os.environ.get("FP4ATTN_REVISION"):
        return arg or os.environ["FP4ATTN_REVISION"]
    rev = git_revision()
    if rev != "unknown":
        return rev
    paths = [os.path.join(ROOT, ".deps", "REVISION")]
    if package_dir:
        paths.append(os.path.join(package_dir, "REVISION"))
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    return "unknown"


def utc_now():
    """The current UTC time, e.g. 2026-11-30T10:36:39Z."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(argv=None, script=None):
    """The command that made a record, as a shell takes it: python3 SCRIPT ARGS. Without argv,
    this process's (sys.argv); with argv (a main(argv) called from Python), script names it."""
    if argv is None:
        script, argv = sys.argv[0], sys.argv[1:]
    script = os.path.abspath(script or sys.argv[0])
    if script.startswith(ROOT + os.sep):
        script = os.path.relpath(script, ROOT)
    return shlex.join([os.path.basename(sys.executable), script, *argv])


def header(suite, revision, device, command=None, date=None):
    """The head of a record: suite, revision, device, date, command (keys in this order)."""
    return {"suite": suite, "revision": revision, "device": device, "date": date or utc_now(),
            "command": command or command_line()}


def part_warnings(suite, ours, peers):
    """What a merge of fp4attn_bench's part (ours) with the peers' part must say: parts of
    different revisions or devices, and a run of ours that did not complete."""
    warnings = [f"{field} differs: fp4attn_bench {ours.get(field)!r}, peers {peers.get(field)!r}"
                for field in ("revision", "device") if ours.get(field) != peers.get(field)]
    if not ours.get("complete", False):
        warnings.append(f"fp4attn_bench {suite} did not complete (complete: false)")
    return warnings


def rounded(x, digits=5):
    """Floats to `digits` significant digits, recursively, so the JSON stays readable."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x


def write_json(doc, path, digits=None):
    """doc as JSON at path (folders made), floats rounded to `digits` significant digits when
    given; one space of indent, a final newline."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc if digits is None else rounded(doc, digits), f, indent=1)
        f.write("\n")


def add_revision_flag(ap):
    """--revision SHA on an argparse parser (revision() fills in what it leaves out)."""
    ap.add_argument("--revision", default=None,
                    help="git revision recorded (default: $FP4ATTN_REVISION, git, .deps/REVISION)")
