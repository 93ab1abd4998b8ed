"""Drop-in fp4attn for a Hugging Face transformers model, and what it changes in the logits.

The model is a small Llama built from a config with RANDOM weights (nothing can be downloaded
here), so the numbers say how much each recipe perturbs a transformer's forward pass, not how a
trained model's quality changes. Reference: the same BF16 model with torch SDPA ("sdpa").

    python examples/hf_dropin.py [--device cuda] [--recipes fp8,nvfp4] [--seqlen 256]
                                 [--dtype float32]
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fp4attn
import fp4attn.hf


def build(device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )  # head_dim 64, GQA 4:1
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).to(device, dtype).eval().requires_grad_(False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if fp4attn.cuda_available() else "cpu")
    p.add_argument("--recipes", default=None, help="comma-separated (default: all that run)")
    p.add_argument("--seqlen", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args()
    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype)
    recipes = args.recipes.split(",") if args.recipes else (["fp8"] if cuda else fp4attn.RECIPES)

    ids = torch.randint(
        0, 1000, (args.batch, args.seqlen), generator=torch.Generator().manual_seed(1)
    )
    ids = ids.to(args.device)
    model = build(args.device, dtype)
    ref = model(ids).logits.float()
    print(
        f"random-init Llama (4 layers, 8 heads / 2 kv heads, head_dim 64), batch {args.batch}, "
        f"seqlen {args.seqlen}, {args.device}, reference: SDPA in {str(dtype)[6:]}"
    )
    print(f"{'attention':<20} {'logits rel-L2':>14} {'max |diff|':>11} {'top-1 agree':>12}")

    def report(label: str, logits: torch.Tensor) -> None:
        logits = logits.float()
        rel = ((logits - ref).norm() / ref.norm()).item()
        agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
        diff = (logits - ref).abs().max().item()
        print(f"{label:<20} {rel:>14.4f} {diff:>11.4f} {agree:>12.1%}")

    if dtype != torch.float32:  # what the reference's own precision costs, for scale
        report("sdpa (float32)", build(args.device, torch.float32)(ids).logits)
    for recipe in recipes:
        name = fp4attn.hf.register(f"fp4attn-{recipe}", recipe=recipe)
        model.set_attn_implementation(name)  # the same weights, attention switched
        report(f"fp4attn {recipe}", model(ids).logits)


if __name__ == "__main__":
    main()
