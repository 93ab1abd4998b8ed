"""bench/bwd_peers.py (issue 8's fwd+bwd record): a CPU smoke run (golden model against SDPA's math
backend; timings meaningless) checks the record's schema, the FLOP convention and speedup."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bwd_peers", ROOT / "bench" / "bwd_peers.py")
bwd_peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bwd_peers)

HEADER = (
    "suite",
    "revision",
    "device",
    "date",
    "command",
    "software",
    "clocks",
    "config",
    "sm_clock_mhz",
    "flops_convention",
    "peer",
    "skipped",
    "complete",
    "summary",
    "records",
    "peers",
    "accuracy",
)
RECORD = (
    "case",
    "recipe",
    "b",
    "s_q",
    "s_k",
    "h",
    "h_kv",
    "d",
    "causal",
    "flops",
    "median_ms",
    "min_ms",
    "max_ms",
    "tflops",
    "peer",
    "peer_ms",
    "speedup",
)


def test_flop_convention():
    # bench/results/bwd-kernel.json's s = 4k point: 2.5 x forward = 6.871947674e11.
    fwd = bwd_peers.fwd_flops(4, 16, 4096, 4096, 128, causal=True)
    assert fwd == 4 * 4 * 16 * 4096 * 4096 * 128 // 2
    assert bwd_peers.kind_flops("bwd", fwd) == 687194767360
    assert bwd_peers.kind_flops("fwd+bwd", fwd) == 3.5 * fwd
    assert bwd_peers.fwd_flops(1, 1, 8, 8, 64, causal=False) == 4 * 8 * 8 * 64


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd") / "bwd.json"
    doc = bwd_peers.main(
        [
            str(out),
            "--device",
            "cpu",
            "--tokens",
            "128",
            "--seqlens",
            "64",
            "--quick",
            "--acc-seqlen",
            "64",
            "--recipes",
            "nvfp4,fp8",
            "--revision",
            "testrev",
        ]
    )
    return doc, json.loads(out.read_text())


def test_header(smoke):
    _, saved = smoke
    for key in HEADER:
        assert key in saved, key
    assert saved["suite"] == "bwd" and saved["revision"] == "testrev" and saved["complete"]
    assert saved["device"] == "cpu" and "bwd_kernel" not in saved
    assert saved["peer"] == "sdpa-math-bf16"
    assert saved["skipped"] == []  # fwd+bwd-noquant is measured (attn_quantized's autograd)
    assert saved["config"]["smooth_k"] is False
    # The command of main(argv): the script, then argv (not pytest's command line).
    assert saved["command"].split()[1] == "bench/bwd_peers.py"
    assert "--device cpu --tokens 128 --seqlens 64" in saved["command"]


def test_records_schema_flops_and_speedup(smoke):
    _, saved = smoke
    records, peer_recs = saved["records"], saved["peers"]
    # One record per recipe x kind x peer (one CPU peer: fwd+bwd, fwd+bwd-noquant, bwd), two
    # peer records (fwd+bwd, bwd): fwd+bwd-noquant is compared with the peer's fwd+bwd.
    assert len(records) == 6 and len(peer_recs) == 2
    assert {p["kind"] for p in peer_recs} == {"fwd+bwd", "bwd"}
    peer_ms = {p["kind"]: p["median_ms"] for p in peer_recs}
    peer_ms["fwd+bwd-noquant"] = peer_ms["fwd+bwd"]
    kinds = ("fwd+bwd", "fwd+bwd-noquant", "bwd")
    assert sorted(r["kind"] for r in records) == sorted(2 * kinds)
    for r in records + peer_recs:
        for key in RECORD[:-2] if r in peer_recs else RECORD:
            assert key in r, (key, r)
        assert "error" not in r
        assert r["case"] == f"{r['kind']}-d128-s64-causal" and r["kind"] in kinds
        assert (r["b"], r["h"], r["h_kv"], r["s_q"], r["s_k"], r["d"]) == (2, 16, 16, 64, 64, 128)
        assert r["causal"] is True
        fwd = 4 * 2 * 16 * 64 * 64 * 128 // 2
        assert r["flops"] == {"fwd+bwd": 3.5, "fwd+bwd-noquant": 3.5, "bwd": 2.5}[r["kind"]] * fwd
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["tflops"] == pytest.approx(r["flops"] / r["median_ms"] / 1e9, rel=1e-5)
    for r in records:
        assert r["recipe"] in ("nvfp4", "fp8") and r["peer"] == "sdpa-math-bf16"
        assert r["peer_ms"] == peer_ms[r["kind"]]
        assert r["speedup"] == pytest.approx(r["peer_ms"] / r["median_ms"], rel=1e-5)
        if r["kind"] == "fwd+bwd":
            assert r["target_speedup"] == 1.3 and r["meets_target"] == (r["speedup"] >= 1.3)
            assert r["quant_qkv_ms"] > 0
        else:
            assert "target_speedup" not in r and "quant_qkv_ms" not in r
    for recipe in ("nvfp4", "fp8"):
        s = saved["summary"][recipe]
        assert s["fwd+bwd"]["points"] == 1 and s["bwd"]["errors"] == 0
        assert s["fwd+bwd-noquant"]["points"] == 1 and s["fwd+bwd-noquant"]["errors"] == 0
        mine = [r for r in records if r["recipe"] == recipe and r["kind"] == "bwd"]
        assert s["bwd"]["min_speedup"] == pytest.approx(mine[0]["speedup"], rel=1e-5)


def test_gradient_accuracy(smoke):
    _, saved = smoke
    acc = {a.get("peer", a["recipe"]): a for a in saved["accuracy"]}
    assert set(acc) == {"nvfp4", "fp8", "sdpa-math-bf16"}
    for a in acc.values():
        assert "error" not in a and a["case"] == "grad-b1-h4-s64-d128-causal"
        for name in ("o", "dq", "dk", "dv"):
            assert set(a[name]) == {"cos", "rel_l2", "max_abs"}
        assert a["min_grad_cos"] == min(a[n]["cos"] for n in ("dq", "dk", "dv"))
    assert acc["sdpa-math-bf16"]["min_grad_cos"] > 0.9999  # BF16 SDPA against float64
    assert 0.97 < acc["nvfp4"]["min_grad_cos"] < acc["fp8"]["min_grad_cos"] < 0.9999
    assert acc["nvfp4"]["target_cos"] == 0.99
    assert saved["summary"]["nvfp4"]["grad_min_cos"] == acc["nvfp4"]["min_grad_cos"]


def test_unknown_recipe_is_rejected(tmp_path):
    with pytest.raises(SystemExit):
        bwd_peers.main([str(tmp_path / "x.json"), "--device", "cpu", "--recipes", "nvfp5"])


def test_smooth_k_skips_noquant(tmp_path):
    out = tmp_path / "bwd.json"
    doc = bwd_peers.main(
        [str(out), "--device", "cpu", "--tokens", "64", "--seqlens", "64", "--quick",
         "--no-accuracy", "--recipes", "fp8", "--smooth-k", "--revision", "testrev"]
    )  # fmt: skip
    assert doc["config"]["smooth_k"] is True
    assert [s["kind"] for s in doc["skipped"]] == ["fwd+bwd-noquant"]
    assert sorted(r["kind"] for r in doc["records"]) == ["bwd", "fwd+bwd"]
    assert all("error" not in r for r in doc["records"])
    assert set(doc["summary"]["fp8"]) == {"fwd+bwd", "bwd", "grad_min_cos"}
