"""bench/train_gpt.py (issue 8's training evidence): its MXFP4 P/V emulation and a CPU smoke run."""

import importlib.util
import json
import math
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "bench" / "train_gpt.py")
train_gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_gpt)


def test_e2m1_round_nearest_ties_to_even_code():
    x = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, -0.75, -5.0])
    want = torch.tensor([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -4.0])
    assert torch.equal(train_gpt.e2m1_round(x), want)
    # Every grid value maps to itself.
    grid = torch.tensor(train_gpt.E2M1)
    assert torch.equal(train_gpt.e2m1_round(grid), grid)
    assert torch.equal(train_gpt.e2m1_round(-grid), -grid)


def test_mxfp4_fake_blocks_scales_and_straight_through_gradient():
    torch.manual_seed(0)
    x = torch.randn(3, 70, requires_grad=True)  # 70: a partial last block of 6
    q = train_gpt.mxfp4_fake(x, -1)
    for row_x, row_q in zip(x.detach(), q.detach()):
        for j0 in range(0, 70, 32):
            blk, qb = row_x[j0:j0 + 32], row_q[j0:j0 + 32]
            scale = 2.0 ** math.ceil(math.log2(blk.abs().max().item() / 6))
            ratio = qb / scale  # on the E2M1 grid, within half a step of x / scale
            assert set(ratio.abs().tolist()) <= set(train_gpt.E2M1)
            assert 3 <= ratio.abs().max() <= 6  # the block max lands in (3, 6], rounded
            assert torch.all((ratio - blk / scale).abs() <= 1.0 + 1e-6)  # half the widest step
    q.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    # Along another dim: the same as transposing first.
    assert torch.equal(train_gpt.mxfp4_fake(x.detach().T, 0), q.detach().T)


def test_training_smoke_on_cpu(tmp_path):
    out = tmp_path / "training.json"
    rec = train_gpt.main(["--device", "cpu", "--backends", "sdpa,nvfp4,emu-mxfp4-pv", "--steps",
                          "2", "--layers", "1", "--d-model", "128", "--heads", "2", "--seq", "32",
                          "--batch", "2", "--log-every", "1", "--eval-every", "2",
                          "--eval-batches", "1", "--max-bytes", "1000000", "--audit-every", "2",
                          "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["suite"] == "training" and [r["backend"] for r in saved["runs"]] == [
        "sdpa", "nvfp4", "emu-mxfp4-pv"]
    for r in rec["runs"]:
        assert not r["diverged"] and r["steps_run"] == 2 and len(r["curve"]) == 2
        assert len(r["max_grad_norm_curve"]) == 2 and r["max_grad_norm_curve"][0][1] > 0
        # Byte-level cross-entropy starts near ln 256.
        assert abs(r["curve"][0][1] - math.log(256)) < 0.5
    # Same seeds and batches: the backends differ only through the attention's numerics.
    sdpa, nvfp4 = rec["runs"][0], rec["runs"][1]
    assert sdpa["curve"][0][1] != nvfp4["curve"][0][1]
    assert abs(sdpa["curve"][0][1] - nvfp4["curve"][0][1]) < 0.05
    assert "held_out_gap_vs_sdpa" in nvfp4
    # The gradient audit at step 2: one entry per block. FP32 SDPA on the CPU matches float64;
    # nvfp4 (its golden backward) is close but not equal; emu-mxfp4-pv's P/V rounding shows in o.
    for r in rec["runs"]:
        [[step, layers]] = r["grad_audit"]
        assert step == 2 and len(layers) == 1
    sdpa_audit, nvfp4_audit = sdpa["grad_audit"][0][1][0], nvfp4["grad_audit"][0][1][0]
    for key in ("o", "dq", "dk", "dv"):
        assert sdpa_audit[key]["cos"] > 0.99999
        assert abs(sdpa_audit[key]["norm_ratio"] - 1) < 1e-4
        assert 0.9 < nvfp4_audit[key]["cos"] < 0.99999
        assert nvfp4_audit[key]["worst_slice_cos"] <= nvfp4_audit[key]["cos"] + 1e-6
    # A key bias has no gradient in exact attention: float64 and FP32 SDPA sum dK to ~0.
    assert sdpa_audit["dk_sum_share_ref"] < 1e-12 and sdpa_audit["dk_sum_share"] < 1e-4
    for r in rec["runs"]:
        assert [s for s, _ in r["key_bias_norm_curve"]] == [1, 2]


def test_grad_audit_compare_finds_a_wrong_slice():
    torch.manual_seed(1)
    ref = torch.randn(2, 8, 3, 4, dtype=torch.float64)  # [b, s, h, d]
    got = ref.clone()
    got[1, :, 2] *= 10  # one (batch, head) slice ten times too large
    c = train_gpt.grad_audit.compare(got, ref)
    assert c["worst_slice_cos"] > 0.99999 and abs(c["max_slice_norm_ratio"] - 10) < 1e-9
    assert c["norm_ratio"] > 2 and c["cos"] < 0.99
    got[0, :, 0] = -ref[0, :, 0]  # and one pointing the other way
    assert abs(train_gpt.grad_audit.compare(got, ref)["worst_slice_cos"] + 1) < 1e-12


def test_bad_head_dim_is_rejected():
    with pytest.raises(SystemExit):
        train_gpt.main(["--d-model", "96", "--heads", "2", "--device", "cpu"])
