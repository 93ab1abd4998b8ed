"""Every ```python block of README.md and docs/**/*.md runs, so the docs cannot drift from the code.

How a block runs (against whichever fp4attn the test imports: the in-tree build under CTest, the
pip-installed package in scripts/test's install check):

* The blocks of one Markdown file run in order in one namespace, in one fresh interpreter, as a
  reader pasting them one after another would: a block may use what an earlier block of its file
  defined. The cwd is a scratch directory whose top-level entries are symlinks to the
  repository's, so a path such as bench/results/fwd.json resolves as from the repository root
  (where the docs' commands run) while files a block creates stay out of the tree.
* `<!-- gpu -->` on the line right before the fence: the block runs only where CUDA tensors can
  run (fp4attn.cuda_available() and a Hopper device) and is skipped, after a syntax check,
  elsewhere; so no later CPU block may depend on a GPU block.
* `<!-- distributed -->`: the block alone (not in its file's namespace), in 2 processes with
  torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), as
  `torchrun --nproc-per-node 2` runs a script; on CPU (gloo) unless it is marked gpu too, which
  needs 2 GPUs.
* Other fences (sh, bash, console, text, untagged, ...) are not run; a signature or a sketch that
  cannot run is fenced as ```text. A python block that raises, or runs past the timeout, fails;
  the blocks after it in its file are skipped (naming it). A block whose import of an optional
  package (OPTIONAL_PACKAGES) fails is skipped.

Each test id is the file and the line of the block's opening fence, e.g. docs/python.md:33;
tracebacks point at the Markdown file's own lines. Run as a script, this file is the child
interpreter that executes the blocks (`python test_docs_blocks.py SPEC RESULTS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).resolve())  # this file, run as the interpreter of the blocks
PYTHON_TAGS = ("python", "py")
MARKERS = ("gpu", "distributed")
OPTIONAL_PACKAGES = ("transformers", "diffusers")  # test requirements a user may not have
FILE_TIMEOUT_S = 300  # all the blocks of one file
DISTRIBUTED_TIMEOUT_S = 180
WORLD_SIZE = 2

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<name>[\w:-]+)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced python block: where it is, what it says, and its markers."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    code: str  # the code, preceded by blank lines so that its line numbers are the file's
    markers: frozenset[str]

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse_blocks(text: str, path: str) -> list[Block]:
    """The python blocks of a Markdown text, with the markers of the comment lines right above."""
    lines = text.splitlines()
    blocks: list[Block] = []
    markers: set[str] = set()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            marker = _MARKER.match(lines[i])
            markers = markers | {marker["name"]} if marker else set()
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        info = m["info"].strip().split()
        tag = info[0].lower() if info else ""
        end = i + 1
        while end < len(lines):  # the closing fence: the same character, at least as long
            close = lines[end].strip()
            if close.startswith(fence) and close.strip(fence[0]) == "":
                break
            end += 1
        if tag in PYTHON_TAGS:
            body = [_dedent(line, indent) for line in lines[i + 1 : end]]
            code = "\n" * (i + 1) + "\n".join(body) + "\n"
            blocks.append(Block(path, i + 1, code, frozenset(markers & set(MARKERS))))
        markers = set()
        i = end + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    """A block line without its fence's indentation (a fence inside a list item)."""
    lead = len(line) - len(line.lstrip(" "))
    return line[min(lead, indent) :]


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    return [
        block
        for f in doc_files()
        for block in parse_blocks(f.read_text(), str(f.relative_to(REPO)))
    ]


# ---- the child: runs blocks, writes one JSON line per outcome ----------------------------------


def run_blocks(spec_path: str, results_path: str) -> int:
    """Executes the blocks of a spec in order in one namespace, up to the first that fails
    (the later ones may need what it defines); returns 1 if one failed."""
    spec = json.loads(Path(spec_path).read_text())
    sys.path[0] = ""  # the cwd, as for `python -c`, not this test's folder
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    with open(results_path, "a") as results:

        def report(line: int, status: str, detail: str = "") -> None:
            record = {"line": line, "status": status, "detail": detail, "time": time.time()}
            results.write(json.dumps(record) + "\n")
            results.flush()

        for block in spec["blocks"]:
            report(block["line"], "started")
            try:
                exec(compile(block["code"], spec["path"], "exec"), namespace)  # noqa: S102
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in OPTIONAL_PACKAGES:
                    report(block["line"], "error", traceback.format_exc())
                    return 1
                report(block["line"], "missing", e.name)
            except BaseException:  # noqa: BLE001 - SystemExit too: a block must not exit
                report(block["line"], "error", traceback.format_exc())
                return 1
            else:
                report(block["line"], "ok")
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    return 0


# ---- the parent: one child per file (or 2 per distributed block) -------------------------------


@dataclasses.dataclass
class Outcome:
    status: str  # ok, error, missing, timeout, not-run
    detail: str = ""
    time: float = 0.0  # when the child reported it


def _child_env() -> dict[str, str]:
    """The environment of a child: this process's, with the imported fp4attn first on the path
    (absolute: the child's cwd is elsewhere)."""
    import fp4attn

    package_root = str(Path(fp4attn.__file__).resolve().parents[1])
    env = dict(os.environ)
    inherited = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *inherited])
    return env


def _scratch_dir() -> Path:
    """A cwd that reads like the repository root: its top-level entries are symlinks."""
    scratch = Path(tempfile.mkdtemp(prefix="fp4attn-docs-"))
    for entry in REPO.iterdir():
        if not entry.name.startswith("."):
            (scratch / entry.name).symlink_to(entry)
    return scratch


def _read_results(path: Path) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    if path.exists():
        for raw in path.read_text().splitlines():
            r = json.loads(raw)
            outcomes[r["line"]] = Outcome(r["status"], r["detail"], r["time"])
    return outcomes


def _tail(text: str | bytes | None, chars: int = 4000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-chars:]


def _write_spec(scratch: Path, path: str, blocks: list[Block]) -> Path:
    spec = scratch / ".docs-spec.json"
    payload = {"path": str(REPO / path), "blocks": [dataclasses.asdict(b) for b in blocks]}
    spec.write_text(json.dumps(payload, default=sorted))
    return spec


def _finish(
    blocks: list[Block], outcomes: dict[int, Outcome], output: str, timed_out: float | None
) -> dict[int, Outcome]:
    """Outcomes for every block: a block that started and never ended timed out (or its
    interpreter ended: a crash, or killed); blocks after a failure did not run (skipped); a block
    the interpreter never reached otherwise failed. timed_out: the timeout in seconds where it
    expired."""
    first_bad = None
    for b in blocks:
        o = outcomes.get(b.line)
        if o is not None and o.status == "started":
            why = f"ran past the {timed_out} s timeout" if timed_out else "its interpreter ended"
            outcomes[b.line] = Outcome("timeout" if timed_out else "error", why)
            o = outcomes[b.line]
        if o is None and first_bad is not None:
            outcomes[b.line] = Outcome("not-run", f"not run: the block at line {first_bad} failed")
        elif o is None:  # the interpreter ended before it: it cannot have passed
            outcomes[b.line] = Outcome("error", "the interpreter ended before this block")
        elif o.status in ("error", "timeout") and first_bad is None:
            first_bad = b.line
        if outcomes[b.line].status in ("error", "timeout"):
            outcomes[b.line].detail += "\n--- the interpreter's output (tail) ---\n" + output
    return outcomes


@functools.cache
def file_outcomes(path: str, run_gpu: bool) -> dict[int, Outcome]:
    """Runs the non-distributed blocks of one file (GPU ones only with run_gpu) in one child."""
    blocks = [
        b
        for b in all_blocks()
        if b.path == path and "distributed" not in b.markers and (run_gpu or "gpu" not in b.markers)
    ]
    scratch = _scratch_dir()
    results = scratch / ".docs-results.jsonl"
    spec = _write_spec(scratch, path, blocks)
    try:
        proc = subprocess.run(
            [sys.executable, CHILD, str(spec), str(results)],
            cwd=scratch,
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=FILE_TIMEOUT_S,
            check=False,  # the results file says which block failed
        )
        output, timed_out = _tail(proc.stdout + proc.stderr), None
    except subprocess.TimeoutExpired as e:
        output, timed_out = _tail(e.stdout) + _tail(e.stderr), FILE_TIMEOUT_S
    try:
        return _finish(blocks, _read_results(results), output, timed_out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(rank: int, port: int) -> dict[str, str]:
    env = _child_env()
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


def distributed_outcome(block: Block) -> Outcome:
    """Runs one block in WORLD_SIZE processes with torchrun's environment."""
    scratch = _scratch_dir()
    spec = _write_spec(scratch, block.path, [block])
    port, procs = _free_port(), []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        logs = [
            stack.enter_context(open(scratch / f".rank{r}.log", "w+")) for r in range(WORLD_SIZE)
        ]
        for rank, log in enumerate(logs):
            procs.append(
                subprocess.Popen(
                    [sys.executable, CHILD, str(spec), str(scratch / f".rank{rank}.jsonl")],
                    cwd=scratch,
                    env=_torchrun_env(rank, port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            stack.callback(_kill, procs[-1])
        deadline = time.monotonic() + DISTRIBUTED_TIMEOUT_S
        timed_out = DISTRIBUTED_TIMEOUT_S if _wait_all(procs, deadline) else None
        outcomes = []
        for rank, log in enumerate(logs):
            log.seek(0)
            results = _read_results(scratch / f".rank{rank}.jsonl")
            outcome = _finish([block], results, _tail(log.read()), timed_out)[block.line]
            outcome.detail = f"rank {rank}: {outcome.detail}"
            outcomes.append(outcome)
    # The first rank to raise says why; its peers then fail in a collective, or are killed.
    order = {"error": 0, "timeout": 1, "missing": 2, "ok": 3}
    return min(outcomes, key=lambda o: (order.get(o.status, 0), o.time or math.inf))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _wait_all(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Waits for every process; once one fails, the others get a few seconds (a peer left
    waiting in a collective would otherwise hang until the deadline). True if the deadline hit."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > deadline:
            return True
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if failed_at is not None and now - failed_at > 10:
            break
        time.sleep(0.1)
    return False


# ---- the tests ---------------------------------------------------------------------------------


@functools.cache
def _gpu_reason() -> str | None:
    """None where GPU blocks run, else why not."""
    import fp4attn

    if not fp4attn.cuda_available():
        return "needs a CUDA GPU and an fp4attn build with CUDA"
    try:
        fp4attn._C.check_forward_device()
    except ValueError as e:
        return str(e)
    return None


def _skip_reason(block: Block) -> str | None:
    if "gpu" not in block.markers:
        return None
    reason = _gpu_reason()
    if reason is None and "distributed" in block.markers:
        import torch

        if torch.cuda.device_count() < WORLD_SIZE:
            reason = f"needs {WORLD_SIZE} GPUs"
    return None if reason is None else f"<!-- gpu --> block: {reason}"


BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block: Block):
    compile(block.code, block.path, "exec")  # a syntax error fails even where the block is skipped
    reason = _skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    if "distributed" in block.markers:
        outcome = distributed_outcome(block)
    else:
        outcome = file_outcomes(block.path, _gpu_reason() is None)[block.line]
    if outcome.status == "missing":
        pytest.skip(f"needs the optional package {outcome.detail}")
    if outcome.status == "not-run":
        pytest.skip(outcome.detail)
    assert outcome.status == "ok", outcome.detail


# Lines 2-5: a GPU block; 6-10: a marker a blank line away does not apply; 11-13: not run; 14-18:
# a longer fence holds a python fence as text; 19-25: in a list item, "python-example" is no
# marker and the code is indented.
_SAMPLE = """# Title
<!-- gpu -->
```python
x = 1
```
<!-- distributed -->

```py
y = 2
```
```sh
echo hi
```
````markdown
```python
not python
```
````
* a list item:
  <!-- python-example -->
  <!-- distributed -->
  ```python
  if y:
      z = 1 / 0
  ```
"""


def test_parse_blocks_reads_fences_markers_and_lines():
    blocks = parse_blocks(_SAMPLE, "x.md")
    assert [(b.line, sorted(b.markers)) for b in blocks] == [
        (3, ["gpu"]),
        (8, []),
        (22, ["distributed"]),
    ]
    namespace: dict = {}
    for b in blocks[:2]:
        exec(compile(b.code, b.path, "exec"), namespace)  # noqa: S102
    assert (namespace["x"], namespace["y"]) == (1, 2)
    with pytest.raises(ZeroDivisionError) as e:
        exec(compile(blocks[2].code, "x.md", "exec"), namespace)  # noqa: S102
    assert e.traceback[-1].lineno + 1 == 24  # the Markdown file's own line (pytest counts from 0)


def test_the_readme_has_a_python_block():
    # scripts/test's pip-install check runs this file for the README's example.
    assert any(b.path == "README.md" for b in BLOCKS), "README.md: no ```python block"


if __name__ == "__main__":
    sys.exit(run_blocks(sys.argv[1], sys.argv[2]))
