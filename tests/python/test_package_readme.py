"""The README's Python example runs as written (against whichever fp4attn is importable: the
in-tree build under CTest, the pip-installed package in scripts/test's install check)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- python-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert m, "README.md: the block after <!-- python-example --> is missing"
    return m.group(1)


def test_readme_example_runs():
    # A fresh interpreter, as a user would paste it.
    out = subprocess.run(
        [sys.executable, "-c", example()], capture_output=True, text=True, check=True
    ).stdout
    err = float(re.search(r"vs SDPA: ([0-9.e-]+)", out).group(1))
    assert err < 0.2  # nvfp4's documented rel-L2 is 0.133 (numerics.md §6)
    assert "torch.Size([1, 256, 8, 128])" in out
