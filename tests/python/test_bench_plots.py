"""bench/side_by_side_record.py (side_by_side.json -> the fwd-peers record), bench/plot.py's
figures (bench/plots/) and the README generators bench/scripts/perf-table and recipe-table.

The side-by-side input is synthetic (tests/python/data/side_by_side_synthetic.json: magnitudes
from issue 21's table and bench/results/fwd.json, device "NVIDIA H200 (synthetic test data)");
the decode, bwd, fwd and accuracy inputs are the committed records. Everything is written under
tmp_path. The figure tests need matplotlib and are skipped without it."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import math
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
FIXTURE = pathlib.Path(__file__).resolve().parent / "data" / "side_by_side_synthetic.json"
sys.path.insert(0, str(BENCH))

import plots  # bench/plots/, found through the path above
from plots import decode as decode_plots
from plots.fwd_peers_data import FwdPeers, Series


def load(name: str, path: pathlib.Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


sbs = load("side_by_side_record", BENCH / "side_by_side_record.py")
plot_cli = load("plot_cli", BENCH / "plot.py")
perf_table = load("perf_table", BENCH / "scripts" / "perf-table")
recipe_table = load("recipe_table", BENCH / "scripts" / "recipe-table")


def raw() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def record() -> dict:
    return sbs.convert(
        raw(), "abc123def456", "python3 .peers/side_by_side.py", "2026-12-02T12:00:00Z"
    )


@pytest.fixture
def record_file(tmp_path: pathlib.Path, record: dict) -> pathlib.Path:
    path = tmp_path / "results" / "fwd-peers.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    return path


def measurement_keys(row: dict) -> list[str]:
    """The row's measured values: keys that are neither shape nor suffixed."""
    return [k for k in row if k not in sbs.SHAPE_KEYS and sbs.split_key(k)[1] == ""]


# ---- the converter ------------------------------------------------------------------------------


def test_one_record_per_measurement_with_its_speedup_time_and_accuracy(record):
    rows = raw()["rows"]
    assert len(record["records"]) == sum(len(measurement_keys(r)) for r in rows)
    by = {
        (r["system"], r["recipe"], r["path"], r["d"], r["causal"], r["s_q"]): r
        for r in record["records"]
    }
    for row in rows:
        flops = 4 * row["b"] * row["h"] * row["s"] ** 2 * row["d"] / (2 if row["causal"] else 1)
        for key in measurement_keys(row):
            system, recipe, path = sbs.stem_system(key)
            rec = by[(system, recipe, path, row["d"], row["causal"], row["s"])]
            assert rec["tflops"] == row[key]
            assert math.isclose(rec["ms"] * 1e9 * rec["tflops"], flops, rel_tol=1e-12)
            assert rec["speedup"] == (1.0 if system == "sdpa-cudnn-bf16" else row[key + "_x"])
            assert ("cos" in rec) == (key + "_cos" in row)
            if "cos" in rec:
                assert (rec["cos"], rec["rel_l2"]) == (row[key + "_cos"], row[key + "_rl2"])
            assert (rec["b"], rec["h"], rec["h_kv"], rec["s_k"]) == (
                row["b"],
                row["h"],
                row["hkv"],
                row["s"],
            )


def test_names_systems_recipes_and_paths_as_the_schema_says(record):
    systems = {(r["system"], r["recipe"], r["path"]) for r in record["records"]}
    assert ("sdpa-cudnn-bf16", None, "e2e") in systems
    assert ("fa3-bf16", None, "e2e") in systems
    assert {("fa3-fp8", None, "kernel"), ("fa3-fp8", None, "e2e")} <= systems
    assert {("sage2", None, "kernel"), ("sage2", None, "e2e")} <= systems
    assert {("fp4attn", "nvfp4-fast", "kernel"), ("fp4attn", "fp4-direct", "e2e")} <= systems
    assert {s for s, _, _ in systems} == {
        "sdpa-cudnn-bf16",
        "fa3-bf16",
        "fa3-fp8",
        "sage2",
        "fp4attn",
    }
    assert record["suite"] == "fwd-peers" and record["revision"] == "abc123def456"
    assert record["config"]["tokens"] == 16384 and record["config"]["hidden"] == 2048
    assert record["software"] == {"torch": "2.11.0+cu130"}


def test_a_failed_measurement_is_an_error_not_a_record(record):
    (err,) = record["errors"]
    assert (err["system"], err["path"], err["d"], err["causal"], err["s_q"]) == (
        "sage2",
        "kernel",
        64,
        True,
        16384,
    )
    assert "illegal memory access" in err["error"]
    assert not any(
        r["system"] == "sage2"
        and r["path"] == "kernel"
        and r["d"] == 64
        and r["causal"]
        and r["s_q"] == 16384
        for r in record["records"]
    )


@pytest.mark.parametrize(
    "change, error, words",
    [
        (lambda row: row.update(fa4_fp8_k=1.0), ValueError, "fa4_fp8_k"),
        (lambda row: row.update(fp8_k=0.0), ValueError, "fp8_k must be a positive"),
        (lambda row: row.update(fp8_k="fast"), TypeError, "fp8_k must be a number"),
        (lambda row: row.pop("hkv"), ValueError, "lacks hkv"),
        (lambda row: row.update(causal=1), TypeError, "causal must be true or false"),
        (lambda row: row.update(s=2048.0), ValueError, "s must be a positive integer"),
        (lambda row: row.pop("fp8_e2e_rl2"), ValueError, "one of _cos/_rl2"),
        (lambda row: row.pop("fp8_k"), ValueError, "fp8_k_x without fp8_k"),
        (lambda row: row.update(fp8_e2e_cos="high"), TypeError, "fp8_e2e_cos must be a number"),
    ],
)
def test_refuses_a_row_it_cannot_read_by_name(change, error, words):
    doc = raw()
    change(doc["rows"][1])
    with pytest.raises(error, match=words):
        sbs.convert(doc, "rev", "cmd")


def test_refuses_unknown_top_level_keys_empty_rows_and_empty_provenance():
    with pytest.raises(ValueError, match="unknown keys"):
        sbs.convert({**raw(), "note": "x"}, "rev", "cmd")
    with pytest.raises(ValueError, match="rows"):
        sbs.convert({**raw(), "rows": []}, "rev", "cmd")
    with pytest.raises(ValueError, match="revision"):
        sbs.convert(raw(), "", "cmd")
    with pytest.raises(TypeError, match="object"):
        sbs.convert([1], "rev", "cmd")


def test_cli_writes_the_record_and_reports_bad_input(tmp_path, capsys):
    out = tmp_path / "fwd-peers.json"
    assert sbs.main([str(FIXTURE), "--out", str(out), "--revision", "r1", "--command", "c"]) == 0
    doc = json.loads(out.read_text())
    assert (
        doc["revision"] == "r1"
        and doc["command"] == "c"
        and len(doc["records"]) == sum(len(measurement_keys(r)) for r in raw()["rows"])
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"d": 128}]}))
    assert (
        sbs.main([str(bad), "--out", str(tmp_path / "x.json"), "--revision", "r", "--command", "c"])
        == 1
    )
    assert "lacks" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    with pytest.raises(SystemExit):
        sbs.main([str(FIXTURE), "--out", str(out), "--command", "c"])  # --revision required


# ---- bench/plot.py: tables and routing ----------------------------------------------------------


def test_each_suite_has_its_module_and_parts_get_the_generic_table(record):
    assert plots.module_for(record) is plots.fwd_peers
    assert plots.module_for({"suite": "decode"}) is plots.decode
    assert plots.module_for({"suite": "fwd", "part": "peers"}) is plots.generic
    assert plots.module_for({"suite": "cp"}) is plots.generic


def test_fwd_peers_markdown_has_every_point_and_the_errors(record):
    text = plots.fwd_peers.markdown(record)
    data = FwdPeers(record)
    for d in (128, 64):
        for path in ("kernel", "e2e"):
            assert f"### d = {d}, {path}" in text
    nvfp4 = data.get(Series("fp4attn", "nvfp4", "kernel"), 128, True, 8192)
    assert f"{nvfp4['speedup']:.2f}×" in text
    assert "illegal memory access" in text


def test_the_old_fwd_figure_gives_way_to_the_fwd_peers_one(tmp_path, record):
    assert plot_cli.superseded("fwd", "fwd.png", str(tmp_path), {"fwd", "fwd-peers"})
    assert not plot_cli.superseded("fwd", "fwd.png", str(tmp_path), {"fwd"})
    (tmp_path / "fwd-peers.json").write_text(json.dumps(record))
    assert plot_cli.superseded("fwd", "fwd.png", str(tmp_path), {"fwd"}) == "fwd-peers"
    assert not plot_cli.superseded("decode", "decode.png", str(tmp_path), {"fwd-peers"})


# ---- bench/plot.py: figures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def plt():
    pytest.importorskip("matplotlib")
    return plot_cli.load_pyplot()


FIELD_NAMES = (
    "tflops",
    "tbps",
    "peer_ms",
    "bound-no-softmax",
    "sdpa-cudnn-bf16",
    "api-graph",
    "fa3_fp8",
    "sage2_k",
)


def texts(fig) -> dict[str, list[str]]:
    """The figure's texts by role: title, subtitle and caption (figure texts), legend, axes."""
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    axes = [t for ax in fig.axes for t in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())]
    fig_texts = [t.get_text() for t in fig.texts]
    return {"title": [fig.get_suptitle()], "figure": fig_texts, "legend": legend, "axes": axes}


def check_readable(fig, revision: str, max_series: int = 6) -> dict[str, list[str]]:
    t = texts(fig)
    assert 0 < len(t["legend"]) <= max_series + 2  # + reference lines (ceilings)
    assert revision in " ".join(t["figure"]) and revision not in t["title"][0]
    everything = " ".join(text for group in t.values() for text in group)
    for name in FIELD_NAMES:
        assert name not in everything, name
    for ax in fig.axes:  # units on both axes
        assert ax.get_xlabel() and ax.get_ylabel()
    # The legend lies below every axes: its top under the lowest axes' bottom.
    fig.canvas.draw()
    legend_top = fig.legends[0].get_window_extent().y1
    assert all(legend_top < ax.get_window_extent().y0 for ax in fig.axes)
    return t


def test_fwd_figures_name_the_peers_and_answer_the_question(plt, record):
    figs = {f.name: f for f in plots.fwd_peers.figures(record, "bench/results/fwd-peers.json")}
    assert set(figs) == {"fwd.png", "fwd-e2e.png"}
    kernel = check_readable(figs["fwd.png"].draw(plt), "abc123def456")
    assert kernel["legend"] == [
        "cuDNN BF16 (torch SDPA)",
        "FlashAttention-3 FP8",
        "SageAttention2",
        "fp4attn fp8",
        "fp4attn fp8-fast",
    ]
    data = FwdPeers(record)
    fa3 = data.speedup_geomean(Series("fa3-fp8", None, "kernel"), 128)
    assert any(f"FlashAttention-3 FP8 {fa3:.2f}×" in text for text in kernel["figure"])
    e2e = check_readable(figs["fwd-e2e.png"].draw(plt), "abc123def456")
    assert "FlashAttention-3 BF16" in e2e["legend"] and len(e2e["legend"]) == 6
    plt.close("all")


def test_fwd_figure_draws_every_measured_point(plt, record):
    fig = plots.fwd_peers.figures(record, "x")[0].draw(plt)
    full = fig.axes[0]
    lines = {ln.get_label(): ln for ln in full.get_lines()}
    sage = lines["SageAttention2"]
    want = [
        r["tflops"]
        for r in sorted(
            (
                r
                for r in record["records"]
                if r["system"] == "sage2"
                and r["path"] == "kernel"
                and r["d"] == 128
                and not r["causal"]
            ),
            key=lambda r: r["s_q"],
        )
    ]
    assert list(sage.get_ydata()) == want
    plt.close("all")


def test_decode_figure_from_the_committed_record(plt):
    doc = json.loads((RESULTS / "decode.json").read_text())
    (fig_spec,) = plots.decode.figures(doc, "bench/results/decode.json")
    fig = fig_spec.draw(plt)
    t = check_readable(fig, doc["revision"])
    assert "cuDNN BF16 (torch SDPA), BF16 cache" in t["legend"]
    assert {"fp4attn, NVFP4 cache", "fp4attn, FP8 cache"} <= set(t["legend"])
    ceiling = [ln for ln in fig.axes[0].get_lines() if "read ceiling" in ln.get_label()]
    assert ceiling and ceiling[0].get_ydata()[0] == doc["ceilings"]["read_tbps"]
    ours, peers = decode_plots.graph_points(doc)
    assert all(r["path"] == "api-graph" and r.get("s_q", 1) == 1 for r in ours["nvfp4"])
    assert len(peers) == len(ours["nvfp4"])
    plt.close("all")


def test_bwd_and_old_fwd_figures_from_the_committed_records(plt):
    bwd = json.loads((RESULTS / "bwd.json").read_text())
    t = check_readable(plots.bwd.figures(bwd, "b")[0].draw(plt), bwd["revision"])
    assert {"cuDNN BF16 (torch SDPA)", "fp4attn nvfp4"} <= set(t["legend"])
    fwd = json.loads((RESULTS / "fwd.json").read_text())
    assert any(r["recipe"] == "bound-no-softmax" for r in fwd["records"])  # and not drawn:
    t = check_readable(plots.fwd.figures(fwd, "f")[0].draw(plt), fwd["revision"])
    assert len(t["legend"]) == 6
    plt.close("all")


def test_plot_cli_writes_tables_and_figures(plt, tmp_path, record_file):
    out = tmp_path / "out"
    rc = plot_cli.main(
        [
            str(record_file),
            str(RESULTS / "fwd.json"),
            str(RESULTS / "decode.json"),
            "--out-dir",
            str(out),
        ]
    )
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    assert {"fwd.png", "fwd-e2e.png", "decode.png", "fwd-peers.md", "fwd.md", "decode.md"} <= names
    assert (out / "fwd.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the README tables -------------------------------------------------------------------------


README_TEXT = """# x

<!-- perf-table:begin -->
stale section
<!-- perf-table:end -->

<!-- recipe-table:begin -->
<!-- recipe-table:end -->
"""


@pytest.fixture
def readme_copy(tmp_path) -> pathlib.Path:
    path = tmp_path / "README.md"
    path.write_text(README_TEXT)
    return path


def perf(*args: str) -> int:
    return perf_table.main(list(args))


def test_perf_table_writes_checks_and_prints(readme_copy, record_file, record, capsys):
    assert perf("--json", str(record_file), "--readme", str(readme_copy), "--check") == 1
    assert readme_copy.read_text() == README_TEXT  # --check writes nothing
    assert perf("--json", str(record_file), "--readme", str(readme_copy)) == 0
    text = readme_copy.read_text()
    assert "stale section" not in text and "<!-- recipe-table:begin -->" in text
    assert perf("--json", str(record_file), "--readme", str(readme_copy), "--check") == 0
    capsys.readouterr()
    assert perf("--json", str(record_file), "--readme", str(readme_copy), "--print") == 0
    assert capsys.readouterr().out.strip() in text
    data = FwdPeers(record)
    row = next(line for line in text.splitlines() if line.startswith("| full | 4k |"))
    fa3 = data.get(Series("fa3-fp8", None, "kernel"), 128, False, 4096)["speedup"]
    fast_e2e = data.get(Series("fp4attn", "nvfp4-fast", "e2e"), 128, False, 4096)["speedup"]
    assert f"{fa3:.2f}" in row and f"{fast_e2e:.2f}" in row
    assert "<summary>d = 64</summary>" in text and "failed" in text


def test_perf_table_bolds_the_fastest_of_each_path():
    assert perf_table.bold_best([1.2, None, 1.5, 1.499]) == ["1.20", "-", "**1.50**", "**1.50**"]
    assert perf_table.bold_best([None]) == ["-"]


def test_perf_table_falls_back_to_the_fwd_record_without_its_internal_series(readme_copy, tmp_path):
    absent = str(tmp_path / "none.json")
    assert (
        perf(
            "--json", absent, "--fwd-json", str(RESULTS / "fwd.json"), "--readme", str(readme_copy)
        )
        == 0
    )
    text = readme_copy.read_text()
    assert "fwd.json" in text and "nvfp4-fast" in text and "bound-no-softmax" not in text
    assert perf("--json", absent, "--fwd-json", "", "--readme", str(readme_copy)) == 0
    assert "No forward record yet" in readme_copy.read_text()


def test_perf_table_refuses_a_readme_without_markers(tmp_path, record_file, capsys):
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing\n")
    assert perf("--json", str(record_file), "--readme", str(bare)) == 2
    assert "perf-table:begin" in capsys.readouterr().err and bare.read_text() == "# nothing\n"


def test_recipe_table_rows_accuracy_speed_and_blackwell(readme_copy, record_file, record):
    acc = RESULTS / "accuracy.json"
    args = ["--json", str(record_file), "--accuracy", str(acc), "--readme", str(readme_copy)]
    assert recipe_table.main(args) == 0 and recipe_table.main(args + ["--check"]) == 0
    text = readme_copy.read_text()
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| recipe") and not line.startswith("|---")
    }
    assert list(rows) == [
        "`fp8`",
        "`fp8-fast`",
        "`nvfp4`",
        "`nvfp4-fast`",
        "`mxfp4`",
        "`nvfp4-hx`",
        "`nvfp4-all`",
        "`fp4-direct`",
        "`bf16` (reference)",
        "FlashAttention-3 FP8 (peer)",
        "SageAttention2 (peer)",
    ]
    data = FwdPeers(record)
    fa3 = data.accuracy("fa3-fp8", None, 128, False, 2048)
    assert rows["FlashAttention-3 FP8 (peer)"][1] == f"{fa3['cos']:.5f} / {fa3['rel_l2']:.4f}"
    fast = [
        r["speedup"]
        for r in record["records"]
        if r["system"] == "fp4attn"
        and r["recipe"] == "nvfp4-fast"
        and r["path"] == "kernel"
        and r["d"] == 128
        and r["s_q"] >= 4096
    ]
    assert len(fast) == 6
    want = math.exp(sum(map(math.log, fast)) / len(fast))
    assert rows["`nvfp4-fast`"][4] == f"{want:.2f}×"
    outliers = next(
        r
        for run in json.loads(acc.read_text())["runs"]
        if run["name"] == "noncausal"
        for r in run["records"]
        if r["recipe"] == "nvfp4" and r["input"] == "outliers"
    )
    assert rows["`nvfp4`"][2] == f"{outliers['cos']:.5f} / {outliers['rel_l2']:.4f}"
    assert rows["`nvfp4-hx`"][6].startswith("Q·Kᵀ yes") and rows["`mxfp4`"][6].startswith(
        "Q·Kᵀ yes"
    )
    assert rows["`nvfp4`"][6].startswith("no") and rows["`fp8`"][6].startswith("n/a")
    assert rows["`nvfp4-hx`"][
        1
    ] == "-" and "nvfp4-hx, nvfp4-all: not in that record" in text.replace("\n", " ")


def test_recipe_table_blackwell_column_follows_the_measurement():
    runs = recipe_table.suite_accuracy(json.loads((RESULTS / "accuracy.json").read_text()))
    changed = copy.deepcopy(runs)
    changed["emulation-causal"][("mxfp4", "outliers")]["folded_vs_exact"]["rel_l2"] = 0.01
    assert recipe_table.blackwell("mxfp4", runs).startswith("Q·Kᵀ yes")
    assert recipe_table.blackwell("mxfp4", changed).startswith("no")
    with pytest.raises(ValueError, match="accuracy record"):
        recipe_table.suite_accuracy({"suite": "fwd"})


def test_recipe_table_without_records_says_so(tmp_path, capsys):
    assert (
        recipe_table.main(
            [
                "--json",
                str(tmp_path / "none.json"),
                "--accuracy",
                str(tmp_path / "none2.json"),
                "--print",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "No fwd-peers record yet" in out and "No accuracy record" in out
