"""The process-wide default recipe (fp4attn.set_default_recipe / use_recipe / get_default_recipe):
what every public function runs when its recipe is None."""

import pytest
import torch

import fp4attn


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 16, 2, 64, generator=g, dtype=torch.bfloat16) for _ in range(3)]


def test_default_is_fp8_and_none_means_it():
    assert fp4attn.get_default_recipe() == "fp8"
    q, k, v = _qkv()
    torch.testing.assert_close(
        fp4attn.attn_func(q, k, v), fp4attn.attn_func(q, k, v, recipe="fp8"), rtol=0, atol=0
    )


def test_set_default_recipe_returns_previous_and_changes_every_function():
    q, k, v = _qkv(1)
    previous = fp4attn.set_default_recipe("nvfp4")
    try:
        assert previous == "fp8" and fp4attn.get_default_recipe() == "nvfp4"
        want = fp4attn.attn_func(q, k, v, recipe="nvfp4")
        torch.testing.assert_close(fp4attn.attn_func(q, k, v), want, rtol=0, atol=0)
        assert fp4attn.quantize_qkv(q, k, v).recipe == "nvfp4"
        fq = fp4attn.fake_quantize(q)
        torch.testing.assert_close(fq, fp4attn.fake_quantize(q, recipe="nvfp4"), rtol=0, atol=0)
        qd, _ = fp4attn.quantize_q(q)
        assert torch.equal(
            qd.view(torch.uint8), fp4attn.quantize_q(q, recipe="nvfp4")[0].view(torch.uint8)
        )
        cu = torch.tensor([0, 16], dtype=torch.int32)
        ov = fp4attn.attn_varlen_func(q[0], k[0], v[0], cu, cu)
        torch.testing.assert_close(ov, want[0], rtol=0, atol=0)
    finally:
        fp4attn.set_default_recipe(previous)
    assert fp4attn.get_default_recipe() == "fp8"


def test_use_recipe_restores_on_exit_and_on_error():
    with fp4attn.use_recipe("nvfp4-fast") as r:
        assert r == "nvfp4-fast" and fp4attn.get_default_recipe() == "nvfp4-fast"
        with fp4attn.use_recipe("mxfp4"):
            assert fp4attn.get_default_recipe() == "mxfp4"
        assert fp4attn.get_default_recipe() == "nvfp4-fast"
    assert fp4attn.get_default_recipe() == "fp8"
    with pytest.raises(RuntimeError, match="boom"), fp4attn.use_recipe("nvfp4"):
        raise RuntimeError("boom")
    assert fp4attn.get_default_recipe() == "fp8"


@pytest.mark.parametrize("bad, error", [("fp5", ValueError), (None, TypeError), (4, TypeError)])
def test_bad_default_refused_and_unchanged(bad, error):
    with pytest.raises(error, match="recipe"):
        fp4attn.set_default_recipe(bad)
    with pytest.raises(error, match="recipe"), fp4attn.use_recipe(bad):
        pass
    assert fp4attn.get_default_recipe() == "fp8"
