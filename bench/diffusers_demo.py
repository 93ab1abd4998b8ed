#!/usr/bin/env python3
"""One Wan2.1-14B transformer block (diffusers' WanTransformerBlock, random weights, bfloat16) at
480p video (81 frames: 21 x 30 x 52 = 32760 tokens, 512 text tokens), its attention routed
through diffusers' attention dispatcher to each system:

* cudnn-bf16: diffusers' native backend (torch SDPA) under sdpa_kernel(CUDNN_ATTENTION): the
  baseline of every speedup and the reference of every rel-L2;
* fp4attn-RECIPE: fp4attn.diffusers.enable(block, recipe=RECIPE), for each of --recipes;
* fa3-fp8: FlashAttention-3's flash_attn_func on q, k, v cast to float8_e4m3fn (descales 1),
  when flash_attn_interface imports ($FA3_PATH is added to sys.path), routed the same way: the
  dispatcher's native slot holds it for the run.

For each: the block's forward (block_ms) and the self-attention alone at the block's shape
(attn_ms, through dispatch_attention_fn), CUDA events around each call after warm-up, median of
--reps; the rel-L2 of the block's output and of the attention's against cudnn-bf16's. One line
per result; --out writes the JSON. --tiny runs a toy block on the CPU (the golden model, wall
clock), --dry-run prints the plan only.

    python3 bench/diffusers_demo.py --out bench/results/diffusers-wan.json
    FA3_PATH=/path/to/flash-attention/hopper python3 bench/diffusers_demo.py --recipes fp8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # the records' shared head and file writing

WAN_14B = {"dim": 5120, "heads": 40, "ffn": 13824, "frames": 21, "height": 30, "width": 52}
TINY = {"dim": 128, "heads": 2, "ffn": 256, "frames": 2, "height": 4, "width": 4}
TEXT_TOKENS = 512  # Wan's umT5 context length
TINY_TEXT_TOKENS = 8


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default="fp8,nvfp4-fast", help="fp4attn recipes, comma-separated")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (>= 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before them")
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--tiny", action="store_true", help="a toy block on the CPU (golden model)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--no-fa3", action="store_true", help="skip FlashAttention-3 even if found")
    record.add_revision_flag(ap)
    args = ap.parse_args(argv)
    import fp4attn

    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in args.recipes if r not in fp4attn.RECIPES]
    if unknown or not args.recipes:
        ap.error(f"--recipes: unknown {unknown} (known: {', '.join(fp4attn.RECIPES)})")
    if args.reps < (1 if args.tiny else 20):
        ap.error("--reps: at least 20 (a median of fewer is noise); --tiny takes any >= 1")
    if args.warmup < 0:
        ap.error("--warmup: expected >= 0")
    return args


def shape_of(tiny: bool) -> dict:
    cfg = TINY if tiny else WAN_14B
    tokens = cfg["frames"] * cfg["height"] * cfg["width"]
    text = TINY_TEXT_TOKENS if tiny else TEXT_TOKENS
    return {**cfg, "head_dim": cfg["dim"] // cfg["heads"], "tokens": tokens, "text_tokens": text}


def load_fa3():
    """FlashAttention-3's flash_attn_func, or (None, why not)."""
    if os.environ.get("FA3_PATH"):
        sys.path.insert(0, os.environ["FA3_PATH"])
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError as e:
        return None, f"flash_attn_interface not importable ({e}); set FA3_PATH"
    return flash_attn_func, None


def fa3_fp8_backend(flash_attn_func):
    """A stand-in for diffusers' native backend: FA3 on the BSHD inputs cast to E4M3."""
    import torch

    def attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
        **rest,
    ):
        if attn_mask is not None or dropout_p or any(v not in (None, False) for v in rest.values()):
            raise ValueError("fa3-fp8: the demo's route takes no mask, dropout or other option")
        e4m3 = [t.to(torch.float8_e4m3fn) for t in (query, key, value)]
        out = flash_attn_func(*e4m3, softmax_scale=scale, causal=bool(is_causal))
        out = out[0] if isinstance(out, tuple) else out  # some FA3 releases return (out, lse)
        return out.to(query.dtype)

    return attention


@contextlib.contextmanager
def native_slot_holding(fn):
    """diffusers' native backend is `fn` inside the block (the mechanism fp4attn.diffusers
    uses, through its version-checked accessor of the registry)."""
    from fp4attn.diffusers import _dispatcher

    functions, native, _ = _dispatcher()
    original, functions[native] = functions[native], fn
    try:
        yield
    finally:
        functions[native] = original


def median_ms(fn, device, warmup: int, reps: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in events)


def build(shape: dict, device, dtype):
    """The block, its inputs (as WanTransformer3DModel hands them to a block) and self-attention
    inputs at its shape."""
    import torch
    from diffusers.models.transformers.transformer_wan import (
        WanRotaryPosEmbed,
        WanTransformerBlock,
    )

    torch.manual_seed(0)
    dim, heads, head_dim = shape["dim"], shape["heads"], shape["head_dim"]
    with torch.device(device):
        block = WanTransformerBlock(
            dim, shape["ffn"], heads, qk_norm="rms_norm_across_heads", cross_attn_norm=True
        )
        block = block.to(dtype).eval().requires_grad_(False)
        rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=1024)
        latent = torch.empty(1, 16, shape["frames"], 2 * shape["height"], 2 * shape["width"])
        rotary = rope(latent)  # (cos, sin), each [1, tokens, 1, head_dim]
        x = torch.randn(1, shape["tokens"], dim, dtype=dtype)
        text = torch.randn(1, shape["text_tokens"], dim, dtype=dtype)
        temb = torch.randn(1, 6, dim, dtype=dtype)
        qkv = [torch.randn(1, shape["tokens"], heads, head_dim, dtype=dtype) for _ in range(3)]
    return block, (x, text, temb, rotary), qkv


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = shape_of(args.tiny)
    fa3, fa3_missing = (None, "--no-fa3") if args.no_fa3 else load_fa3()
    if args.tiny and fa3 is not None:
        fa3, fa3_missing = None, "--tiny runs on the CPU"
    systems = ["cudnn-bf16", *(f"fp4attn-{r}" for r in args.recipes)]
    systems += ["fa3-fp8"] if fa3 is not None else []
    print(
        f"shape: {shape}; systems: {', '.join(systems)}"
        + (f"; fa3-fp8 skipped: {fa3_missing}" if fa3 is None else "")
    )
    if args.dry_run:
        return 0

    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fp4attn
    import fp4attn.diffusers

    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not fp4attn.cuda_available():
        sys.exit("diffusers_demo: needs a CUDA build of fp4attn on an H100/H200 (or --tiny)")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    block, block_inputs, qkv = build(shape, device, dtype)
    sdpa = SDPBackend.MATH if args.tiny else SDPBackend.CUDNN_ATTENTION  # cuDNN is CUDA-only

    def routes(system):
        """(context for the block, context for attention alone) that route to `system`."""
        if system == "cudnn-bf16":
            return (lambda: sdpa_kernel(sdpa)), (lambda: sdpa_kernel(sdpa))
        if system == "fa3-fp8":
            backend = fa3_fp8_backend(fa3)
            return (lambda: native_slot_holding(backend)), (lambda: native_slot_holding(backend))
        recipe = system.removeprefix("fp4attn-")
        return (lambda: fp4attn.diffusers.enable(block, recipe)), (
            lambda: fp4attn.diffusers.enable(None, recipe)
        )

    results, reference = {}, {}
    with torch.no_grad():
        for system in systems:
            block_route, attn_route = routes(system)
            with block_route() as routing:
                out = block(*block_inputs).float()
                block_ms = median_ms(lambda: block(*block_inputs), device, args.warmup, args.reps)
            with attn_route() as attn_routing:
                attn_out = dispatch_attention_fn(*qkv).float()
                attn_ms = median_ms(
                    lambda: dispatch_attention_fn(*qkv), device, args.warmup, args.reps
                )
            if system.startswith("fp4attn-"):
                calls = 1 + args.warmup + args.reps
                # A block forward makes two attention calls: self- and cross-attention.
                for stats, expected in ((routing.stats, 2 * calls), (attn_routing.stats, calls)):
                    if (stats.fp4attn, stats.native) != (expected, 0):
                        sys.exit(
                            f"diffusers_demo: {system} did not run fp4attn throughout: {stats}"
                        )
            if system == "cudnn-bf16":
                reference = {"block": out, "attn": attn_out}
            res = {
                "block_ms": block_ms,
                "attn_ms": attn_ms,
                "block_rel_l2": float(
                    (out - reference["block"]).norm() / reference["block"].norm()
                ),
                "attn_rel_l2": float(
                    (attn_out - reference["attn"]).norm() / reference["attn"].norm()
                ),
            }
            base = results.get("cudnn-bf16", res)
            res["block_speedup_vs_cudnn"] = base["block_ms"] / block_ms
            res["attn_speedup_vs_cudnn"] = base["attn_ms"] / attn_ms
            results[system] = res
            print(
                f"{system:18s} block {block_ms:9.3f} ms ({res['block_speedup_vs_cudnn']:.2f}x)  "
                f"attn {attn_ms:9.3f} ms ({res['attn_speedup_vs_cudnn']:.2f}x)  rel-L2 block "
                f"{res['block_rel_l2']:.4f} attn {res['attn_rel_l2']:.4f}",
                flush=True,
            )
    if args.out:
        import diffusers

        device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        doc = record.header("diffusers-demo", record.revision(args.revision), device_name)
        doc.update(
            torch=torch.__version__,
            diffusers=diffusers.__version__,
            fp4attn=fp4attn.__version__,
            shape={**shape, "batch": 1, "dtype": str(dtype).removeprefix("torch.")},
            timing={"warmup": args.warmup, "reps": args.reps, "statistic": "median"},
            reference="cudnn-bf16" if not args.tiny else "cudnn-bf16 (the CPU's SDPA math)",
            fa3_skipped=fa3_missing,
            systems=results,
        )
        record.write_json(doc, args.out, digits=5)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
