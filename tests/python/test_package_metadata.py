"""The installed distribution's metadata and files: one version (python/fp4attn/_version.py),
py.typed, the license, the extras (scripts/wheel-check runs this on the wheel built from the
sdist, in a clean virtual environment). Skips where fp4attn is imported from a build tree
(CTest's python_package); FP4ATTN_EXPECT_INSTALLED=1 turns that skip into a failure."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import pytest

import fp4attn

SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _installed_distribution() -> importlib.metadata.Distribution:
    try:
        dist = importlib.metadata.distribution("fp4attn")
        init = Path(str(dist.locate_file("fp4attn/__init__.py"))).resolve()
        imported = Path(fp4attn.__file__).resolve()
        problem = (
            None
            if init == imported
            else f"the imported fp4attn ({imported}) is not the installed one ({init})"
        )
    except importlib.metadata.PackageNotFoundError:
        dist, problem = None, "no fp4attn distribution is installed (a build tree's fp4attn)"
    if problem is None:
        return dist
    if os.environ.get("FP4ATTN_EXPECT_INSTALLED") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.fixture(scope="module")
def dist() -> importlib.metadata.Distribution:
    return _installed_distribution()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((SOURCE_ROOT / "pyproject.toml").read_text())


def _requires_by_extra(dist: importlib.metadata.Distribution) -> dict[str | None, set[str]]:
    """Requires-Dist lines grouped by the extra of their marker (None: always required)."""
    groups: dict[str | None, set[str]] = {}
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        m = re.fullmatch(r"""\s*extra\s*==\s*["']([^"']+)["']\s*""", marker)
        assert marker == "" or m, f"unexpected marker in Requires-Dist: {line!r}"
        groups.setdefault(m.group(1) if m else None, set()).add(requirement.replace(" ", ""))
    return groups


def test_version_is_the_one_in_version_py(dist):
    text = (SOURCE_ROOT / "python/fp4attn/_version.py").read_text()
    source_version = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)
    assert dist.version == source_version
    assert importlib.metadata.version("fp4attn") == fp4attn.__version__ == source_version


def test_py_typed_is_shipped(dist):
    recorded = {str(f) for f in dist.files}
    assert "fp4attn/py.typed" in recorded
    assert (Path(fp4attn.__file__).parent / "py.typed").is_file()


def test_wheel_holds_only_the_package(dist):
    # The C++ sources, tests and benchmarks stay in the sdist; the wheel is the package and _C.
    tops = {str(f).split("/")[0] for f in dist.files}
    assert tops == {"fp4attn", f"fp4attn-{dist.version}.dist-info"}
    assert any(re.fullmatch(r"fp4attn/_C\..*(so|pyd)", str(f)) for f in dist.files)


def test_license_metadata_and_files(dist):
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert set(dist.metadata.get_all("License-File")) == {"LICENSE", "NOTICE"}
    for name in ("LICENSE", "NOTICE"):
        shipped = dist.read_text(f"licenses/{name}")
        assert shipped == (SOURCE_ROOT / name).read_text(), f"{name} differs from the source's"
    license_text = (SOURCE_ROOT / "LICENSE").read_text()
    assert re.match(r"\s*Apache License\s+Version 2\.0, January 2004\s", license_text)


def test_dependencies_and_extras(dist, pyproject):
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    assert {"hf", "diffusers"} <= set(extras)
    assert set(dist.metadata.get_all("Provides-Extra")) == set(extras)
    declared = {None: set(project["dependencies"]), **{k: set(v) for k, v in extras.items()}}
    declared = {k: {r.replace(" ", "") for r in v} for k, v in declared.items()}
    assert _requires_by_extra(dist) == declared
    assert "transformers>=4.56" in declared["hf"]
    assert "diffusers>=0.35" in declared["diffusers"]
    # A CPU-only install brings its own torch first (docs/python.md); fp4attn only needs one.
    assert declared[None] == {"torch>=2.4"}


def test_descriptive_metadata_matches_pyproject(dist, pyproject):
    project = pyproject["project"]
    meta = dist.metadata
    assert meta["Summary"] == project["description"]
    assert meta["Requires-Python"] == project["requires-python"]
    assert meta.get_all("Classifier") == project["classifiers"]
    assert meta["Keywords"].split(",") == project["keywords"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload() == (SOURCE_ROOT / project["readme"]).read_text()
