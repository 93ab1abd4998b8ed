"""fp4attn.diffusers: diffusers models' attention routed to fp4attn (tiny random-init Wan and Flux
transformers on the CPU golden model; one CUDA test on a Hopper)."""

from __future__ import annotations

import types

import pytest
import torch

import fp4attn
import fp4attn.diffusers

pytest.importorskip("diffusers")
from diffusers import FluxTransformer2DModel, WanTransformer3DModel
from diffusers.models.attention_dispatch import (
    AttentionBackendName,
    _AttentionBackendRegistry,
    attention_backend,
    dispatch_attention_fn,
)

NATIVE = AttentionBackendName.NATIVE
# Attention alone (dispatch_attention_fn on N(0, 1) inputs): numerics.md's nominal rel-L2 is 0.003
# for bf16 (BF16 Q, K, V and P) and 0.05 for fp8, so 0.01 and 0.1 leave about 2x-3x of margin.
ATTN_BOUND = {"bf16": 0.01, "fp8": 0.1}
# Whole model: each block adds its attention to the residual stream through a gate, so the model's
# error is a fraction of the attention's (measured here: 1.2e-4 for bf16 and 1.9e-3 for fp8 on Wan,
# less on Flux); the bounds are ~8x and ~5x above those.
MODEL_BOUND = {"bf16": 1e-3, "fp8": 1e-2}


def rel(a, b):
    return float((a - b).norm() / b.norm())


def native_function():
    return _AttentionBackendRegistry._backends[NATIVE]


def wan(head_dim=64, seed=0):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=head_dim,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=1,
        rope_max_seq_len=32,
    )
    g = torch.Generator().manual_seed(seed + 1)
    inputs = (torch.randn(1, 4, 2, 8, 8, generator=g), torch.tensor([500]))
    text = torch.randn(1, 8, 32, generator=g)  # 32 video tokens attend to 8 text tokens
    model = model.eval().requires_grad_(False)
    return model, lambda: model(*inputs, text, return_dict=False)[0]


def flux():
    torch.manual_seed(2)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=8,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=64,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(16, 24, 24),
    )
    g = torch.Generator().manual_seed(3)
    image, text, pooled = (torch.randn(*s, generator=g) for s in ((1, 16, 8), (1, 6, 16), (1, 8)))
    image_ids = torch.stack([torch.zeros(16), torch.arange(16) // 4, torch.arange(16) % 4], 1)
    text_ids = torch.zeros(6, 3)
    model = model.eval().requires_grad_(False)
    args = (image, text, pooled, torch.tensor([0.5]), image_ids, text_ids)
    return model, lambda: model(*args, return_dict=False)[0]


@pytest.fixture(scope="module")
def wan_model():
    return wan()


@pytest.fixture
def restore_backend():
    """set_attention_backend (diffusers >= 0.36) also sets the process-wide active backend, which
    reset_attention_backend leaves: restored after the test."""
    active = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry._active_backend = active


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
@pytest.mark.parametrize("build", [wan, flux], ids=["wan", "flux"])
def test_model_runs_fp4attn_close_to_native(build, recipe):
    model, run = build()
    reference = run()
    with fp4attn.diffusers.enable(model, recipe=recipe) as routing:
        out = run()
    # Wan: self- and cross-attention of one block; Flux: one joint and one single block.
    assert (routing.stats.fp4attn, routing.stats.native) == (2, 0)
    assert 0 < rel(out, reference) < MODEL_BOUND[recipe]


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_attention_matches_native_within_the_recipe_error(recipe):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 48, 4, 64, generator=g) for _ in range(3))  # BSHD, as the dispatcher
    reference = dispatch_attention_fn(q, k, v, is_causal=True)
    with fp4attn.diffusers.enable(recipe=recipe) as routing:
        out = dispatch_attention_fn(q, k, v, is_causal=True)
    assert routing.stats.fp4attn == 1
    assert 0 < rel(out, reference) < ATTN_BOUND[recipe]


def test_disable_restores_native_bit_for_bit(wan_model):
    model, run = wan_model
    original = native_function()
    reference = run()
    routing = fp4attn.diffusers.enable(model, recipe="fp8")
    assert native_function() is not original
    routed = run()
    routing.disable()
    routing.disable()  # idempotent
    assert native_function() is original
    assert not torch.equal(routed, reference)
    assert torch.equal(run(), reference)
    assert routing.stats.fp4attn == 2 and not routing.active


def test_default_recipe_is_read_at_each_call(wan_model):
    model, run = wan_model
    with fp4attn.diffusers.enable(model, recipe="bf16"):
        explicit = run()
    with fp4attn.diffusers.enable(model) as routing:
        with fp4attn.use_recipe("bf16"):
            by_default = run()
        other = run()  # the process default again (fp8)
    assert torch.equal(by_default, explicit)
    assert not torch.equal(other, explicit)
    assert routing.stats.fp4attn == 4


def test_unsupported_head_dim_falls_back_counted():
    model, run = wan(head_dim=32)
    reference = run()
    with fp4attn.diffusers.enable(model) as routing:
        out = run()
    assert routing.stats.fp4attn == 0
    assert routing.stats.fallbacks == {"head_dim: 32 (fp4attn runs 64, 128)": 2}
    assert torch.equal(out, reference)
    assert "native 2" in str(routing.stats)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"attn_mask": torch.ones(8, 8, dtype=torch.bool)}, "attn_mask: a mask was given"),
        ({"dropout_p": 0.5}, "dropout_p: 0.5 (fp4attn has no dropout)"),
        ({"is_causal": True, "rows": 6}, "is_causal: seqlen_q != seqlen_k"),
        ({"kv_heads": 2}, "heads: 4 query heads over 2 kv heads (enable_gqa not set)"),
        ({"dtype": torch.int32}, "dtype: torch.int32 on cpu"),
    ],
)
def test_what_fp4attn_cannot_run_falls_back_counted(kwargs, reason):
    rows, kv_heads = kwargs.pop("rows", 8), kwargs.pop("kv_heads", 4)
    g = torch.Generator().manual_seed(5)
    dtype = kwargs.pop("dtype", torch.float32)
    q = torch.randn(1, rows, 4, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, 8, kv_heads, 64, generator=g).to(dtype) for _ in range(2))
    try:
        torch.manual_seed(6)  # dropout's
        reference = dispatch_attention_fn(q, k, v, **kwargs)
    except RuntimeError as e:  # what native attention refuses, it still refuses
        reference = e
    with fp4attn.diffusers.enable() as routing:
        torch.manual_seed(6)
        try:
            out = dispatch_attention_fn(q, k, v, **kwargs)
        except RuntimeError as e:
            out = e
    assert routing.stats.fp4attn == 0 and routing.stats.native == 1
    assert next(iter(routing.stats.fallbacks)).startswith(reason)
    if isinstance(reference, Exception):
        assert type(out) is type(reference) and str(out) == str(reference)
    else:
        assert torch.equal(out, reference)


def test_gqa_runs_with_enable_gqa():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 16, 4, 64, generator=g)
    k, v = (torch.randn(1, 16, 2, 64, generator=g) for _ in range(2))
    reference = dispatch_attention_fn(q, k, v, enable_gqa=True)
    with fp4attn.diffusers.enable(recipe="bf16") as routing:
        out = dispatch_attention_fn(q, k, v, enable_gqa=True)
    assert routing.stats.fp4attn == 1
    assert rel(out, reference) < ATTN_BOUND["bf16"]


def test_only_the_enabled_model_is_routed(wan_model):
    model, run = wan_model
    _, run_other = wan(seed=10)
    reference = run_other()
    with fp4attn.diffusers.enable(model, recipe="bf16") as routing:
        assert torch.equal(run_other(), reference)
        with pytest.raises(RuntimeError):
            model(torch.randn(1, 5, 2, 8, 8), torch.tensor([1]), torch.randn(1, 8, 32))
        # the failed forward left its scope: the other model is still not routed
        assert torch.equal(run_other(), reference)
        assert routing.stats.fp4attn == 0
        run()
        assert routing.stats.fp4attn == 2


def test_a_pipeline_routes_its_dispatcher_models(wan_model):
    model, run = wan_model
    pipe = types.SimpleNamespace(components={"transformer": model, "vae": torch.nn.Linear(2, 2)})
    with fp4attn.diffusers.enable(pipe, recipe="bf16") as routing:
        run()
    assert routing.modules == (model,)
    assert routing.stats.fp4attn == 2


def test_works_with_diffusers_backend_selection(wan_model, restore_backend):
    model, run = wan_model
    with fp4attn.diffusers.enable(model, recipe="bf16") as routing, attention_backend("native"):
        run()
    assert routing.stats.fp4attn == 2
    model.set_attention_backend("native")
    try:
        with fp4attn.diffusers.enable(model, recipe="bf16") as routing:
            run()
        assert routing.stats.fp4attn == 2
    finally:
        model.reset_attention_backend()


def test_refusals(wan_model, restore_backend):
    model, run = wan_model
    original = native_function()
    with pytest.raises(fp4attn.UnsupportedError, match="^model_or_pipe: no attention of this "):
        fp4attn.diffusers.enable(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="^model_or_pipe: expected a torch.nn.Module"):
        fp4attn.diffusers.enable("transformer")
    with pytest.raises(ValueError, match="^recipe: unknown recipe 'fp3'"):
        fp4attn.diffusers.enable(model, recipe="fp3")
    with pytest.raises(TypeError, match="^recipe: expected a str"):
        fp4attn.diffusers.enable(model, recipe=8)
    model.set_attention_backend("_native_math")
    try:
        with pytest.raises(ValueError, match=r"^model_or_pipe: .* \(2 on '_native_math'"):
            fp4attn.diffusers.enable(model)
    finally:
        model.reset_attention_backend()
        _AttentionBackendRegistry._active_backend = NATIVE
    routing = fp4attn.diffusers.enable(model)
    with routing, attention_backend("_native_math"), pytest.raises(ValueError, match="_native_m"):
        run()
    assert routing.stats.fp4attn == 0
    assert native_function() is original


def test_cuda_bf16_model():
    if not fp4attn.cuda_available():
        pytest.skip("no CUDA device or a CPU-only build")
    try:
        fp4attn._C.check_forward_device()
    except ValueError as e:
        pytest.skip(str(e))
    model, run = wan()
    model.to("cuda", torch.bfloat16)
    # The model's inputs are made on the CPU in float32: move them with a forward pre-hook.
    hook = model.register_forward_pre_hook(
        lambda m, args: tuple(a.to("cuda", torch.bfloat16 if a.is_floating_point() else a.dtype)
                              for a in args)
    )  # fmt: skip
    try:
        reference = run().float()
        with fp4attn.diffusers.enable(model, recipe="fp8") as routing:
            out = run().float()
    finally:
        hook.remove()
    assert (routing.stats.fp4attn, routing.stats.native) == (2, 0)
    assert rel(out, reference) < MODEL_BOUND["fp8"]
