"""fp4attn.hf: fp4attn as a transformers attn_implementation (a tiny random-init Llama)."""

import inspect

import pytest
import torch

import fp4attn

transformers = pytest.importorskip("transformers")
import fp4attn.hf


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )  # head_dim 64, GQA
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config).eval().requires_grad_(False)


def logits(model, impl, ids, **kw):
    model.set_attn_implementation(impl)
    return model(ids, **kw).logits


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
def test_prefill_logits_close_to_sdpa(model, recipe):
    ids = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(1))
    ref = logits(model, "sdpa", ids)
    out = logits(model, fp4attn.hf.register(f"fp4attn-{recipe}", recipe), ids)
    assert rel(out, ref) < {"bf16": 0.01, "fp8": 0.1, "nvfp4": 0.1}[recipe]


def test_decode_with_kv_cache(model):
    """A cached decode step has s_q=1 < s_k: bottom-right causal sees every cached key."""
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    name = fp4attn.hf.register("fp4attn-bf16", "bf16")
    outs = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        prefill = model(ids[:, :-1], use_cache=True)
        # transformers 5.x calls the cache `cache`, 4.x `past_key_values`.
        cache = getattr(prefill, "cache", None) or prefill.past_key_values
        kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        outs[impl] = model(ids[:, -1:], **{kw: cache}).logits
    assert rel(outs[name], outs["sdpa"]) < 0.01


def test_padding_is_refused(model):
    ids = torch.randint(0, 256, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :4] = 0
    with pytest.raises(fp4attn.UnsupportedError, match="^attention_mask: "):
        logits(model, fp4attn.hf.register(), ids, attention_mask=mask)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"s_aux": torch.zeros(4)}, "^s_aux: attention sinks"),
        ({"cu_seq_lens_q": torch.tensor([0, 8, 16], dtype=torch.int32)}, "^cu_seq_lens_q: packed"),
        ({"cu_seq_lens_k": torch.tensor([0, 8, 16], dtype=torch.int32)}, "^cu_seq_lens_k: packed"),
    ],
)
def test_what_it_cannot_honour_is_refused(kwargs, match):
    # Called as transformers' AttentionInterface calls it: a silent fallback would drop the sinks
    # or let tokens attend across packed documents.
    forward = transformers.AttentionInterface()[fp4attn.hf.register()]
    q = torch.randn(1, 4, 16, 64, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    module = torch.nn.Module()
    with pytest.raises(fp4attn.UnsupportedError, match=match):
        forward(module, q, kv, kv, None, **kwargs)


def test_unknown_recipe():
    with pytest.raises(ValueError, match="^recipe: unknown recipe"):
        fp4attn.hf.register("x", recipe="fp3")


def test_example_script_runs():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "hf_dropin.py"
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--device",
            "cpu",
            "--recipes",
            "bf16,nvfp4",
            "--seqlen",
            "32",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "random-init Llama" in out and "nvfp4" in out.splitlines()[-1]
