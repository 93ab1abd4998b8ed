"""numerics.md's NaN rule on the GPU (issue 26, finding 6): a non-finite value in a key that a row
reads reaches that row, also where the key's P is exactly 0 (the MMA's 0 * NaN), and the GPU's
NaN pattern is the golden model's, recipe by recipe. Non-causal, so every row reads every key
(keys a row never reads are exempt from the rule). Runs on a Hopper; skipped elsewhere."""

import pytest
import torch

import fp4attn
from fp4attn import _layout

pytestmark = pytest.mark.usefixtures("hopper")

ENGINE_RECIPES = tuple(r for r in fp4attn.RECIPES if r != "bf16")  # every GPU forward recipe
B, S, H, D = 1, 160, 2, 64  # 160 keys: a full and a partial 128-key tile
KEY, CHANNEL = 37, 5


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=g) for _ in range(3))
    return q, k, v


def nan_mask(o: torch.Tensor) -> torch.Tensor:
    return torch.isnan(o.float().cpu())


def run_both(recipe, q, k, v):
    cpu = fp4attn.attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), recipe=recipe)
    gpu = fp4attn.attn_func(*(t.bfloat16().cuda() for t in (q, k, v)), recipe=recipe)
    return nan_mask(cpu), nan_mask(gpu)


def test_engine_recipes_are_every_gpu_recipe():
    assert set(_layout.GPU_BACKWARD_RECIPES) <= set(ENGINE_RECIPES)


@pytest.mark.parametrize("recipe", ENGINE_RECIPES)
def test_inf_in_v_where_p_is_zero_reaches_every_row(recipe):
    # Q positive and key KEY's K very negative: that key's score is about -1400 for every row, so
    # its P is exactly 0; its V holds -inf in one channel. float64: 0 * -inf = NaN in that channel
    # of every row (and nothing else).
    q, k, v = inputs(1)
    q = q.abs() + 1
    k[:, KEY] = -100.0
    v[:, KEY, :, CHANNEL] = float("-inf")
    cpu, gpu = run_both(recipe, q, k, v)
    want = torch.zeros_like(cpu)
    want[..., CHANNEL] = True
    assert torch.equal(cpu, want), f"golden: {int(cpu.sum())} NaN, expected {int(want.sum())}"
    assert torch.equal(gpu, cpu), f"GPU NaN pattern differs from the golden model's ({recipe})"


@pytest.mark.parametrize("recipe", ENGINE_RECIPES)
def test_nan_in_k_reaches_every_row_of_its_head(recipe):
    # A NaN K value makes its block scale NaN: the scores of the block are NaN, so P, l and O of
    # every row of that head are NaN; the other head stays finite. Where the block scale folds
    # into a finite tile factor (the FP4 recipes), the NaN reaches the kernel as a NaN score,
    # which the exp-free code maps must keep (p_gen.cuh).
    q, k, v = inputs(2)
    k[:, KEY, 1, CHANNEL] = float("nan")
    cpu, gpu = run_both(recipe, q, k, v)
    assert cpu[:, :, 1].all() and not cpu[:, :, 0].any(), f"golden pattern ({recipe})"
    assert torch.equal(gpu, cpu), f"GPU NaN pattern differs from the golden model's ({recipe})"


@pytest.mark.parametrize("recipe", ENGINE_RECIPES)
def test_finite_inputs_give_finite_outputs(recipe):
    q, k, v = inputs(3)
    cpu, gpu = run_both(recipe, q, k, v)
    assert not cpu.any() and not gpu.any()


@pytest.mark.parametrize("fmt", fp4attn.paged.FORMATS)
def test_nan_in_a_cached_key_reaches_the_decode_rows_that_read_it(fmt):
    # Two sequences of 40 tokens in pages of 16, 2 kv heads; a NaN in one K value of sequence 0,
    # kv head 1. Its block scale (nvfp4) or the tensor's scale (fp8: calibrated by the finite
    # amax, the value itself encodes as NaN) makes the scores of that key NaN, so every query head
    # of that kv head in sequence 0 is NaN and nothing else: the GPU decode's pattern is the
    # golden model's.
    h, h_kv, d, page, length = 4, 2, 64, 16, 40
    g = torch.Generator().manual_seed(5)
    kv = torch.randn(2 * length, h_kv, d, generator=g).bfloat16()
    k, v = kv.clone(), torch.randn(2 * length, h_kv, d, generator=g).bfloat16()
    k[7, 1, 3] = float("nan")
    slots = torch.arange(2 * length)
    table = torch.arange(2 * 3, dtype=torch.int32).view(2, 3)  # 3 pages per sequence
    lens = torch.full((2,), length, dtype=torch.int32)
    q = torch.randn(2, 1, h, d, generator=g).bfloat16()

    def run(device):
        cache = fp4attn.PagedKVCache.empty(6, page, h_kv, d, format=fmt, device=device)
        fp4attn.append_kv(cache, k.to(device), v.to(device), slots.to(device))
        o = fp4attn.decode(q.to(device), cache, table.to(device), lens.to(device), causal=True)
        return nan_mask(o)

    cpu, gpu = run("cpu"), run("cuda")
    assert cpu[0, :, 2:].all() and not cpu[0, :, :2].any() and not cpu[1].any(), "golden pattern"
    assert torch.equal(gpu, cpu), f"GPU decode NaN pattern differs from the golden model's ({fmt})"
