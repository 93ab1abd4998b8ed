"""bench/fwd_record.py (issue 4/6's forward record): its merge of fp4attn_bench's and the peers'
JSON, the bound variant's records (--bound) included, on synthetic inputs."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fwd_record", ROOT / "bench" / "fwd_record.py")
fwd_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fwd_record)


def test_selftest_merges_ours_peers_and_the_bound():
    assert fwd_record.selftest() == 0


def test_bound_records_are_the_fp8_ones_renamed_without_accuracy():
    nosm = {"records": [{"case": "d128-s4096-noncausal", "recipe": "fp8", "ms": 1.0, "cos": 0.2},
                        {"case": "d128-s4096-noncausal", "recipe": "nvfp4-fast", "ms": 1.0}]}
    (r,) = fwd_record.bound_records(nosm)
    assert r["recipe"] == "bound-no-softmax" and r["ms"] == 1.0 and "cos" not in r
