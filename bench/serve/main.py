"""The command: its arguments, every system at every context, the summary against issue 22's
targets, and the record (written after each system, so that a crash keeps the runs)."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
import peers  # device name, software versions, clocks
import record  # the records' shared head and file writing
import torch

from .budget import page_bytes, sequences_at_budget, verify_budget
from .checks import compare_guards, self_test
from .common import PAGE, first_line, log, tail
from .loop import run_system
from .model import LLAMA31_8B, TINY, Model
from .systems import SYSTEMS

# --help's description: the first paragraph of bench/serve_loop.py's docstring.
DESCRIPTION = (
    "A decoder LLM generation loop with continuous batching, with its KV cache in fp4attn's "
    "NVFP4 paged cache, beside the same model with a BF16 paged cache and with SDPA on a "
    "contiguous BF16 cache (issue 22, item 3; the record bench/results/serve.json)."
)
TARGETS = {"tokens_vs_bf16_paged": 1.3, "sequences_vs_bf16_paged": 3.3}  # issue 22, at 16k


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("out", help="JSON file to write (serve.json-style)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true",
                    help="small model (hidden 256, 4/2 heads, d 64, 2 layers, vocab 1000), "
                    "batch 3, context 64, 3 steps, and the self-test")  # fmt: skip
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 8; tiny 2)")
    ap.add_argument("--batch", type=int, default=None, help="slots (default 32; tiny 3)")
    ap.add_argument("--contexts", default=None, help="default 4096,16384 (tiny 64)")
    ap.add_argument("--gen-range", default=None,
                    help="LO:HI new tokens per sequence (default 16:128; tiny 2:6)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 32; tiny 3)")
    ap.add_argument("--warmup", type=int, default=None, help="steps before timing (default 5)")
    ap.add_argument("--guard-steps", type=int, default=3,
                    help="teacher-forced steps compared across systems (>= 1)")  # fmt: skip
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--bf16-paged-attention", default="auto", choices=("auto", "flex", "gather"),
                    help="auto: FlexAttention, the gather + SDPA fallback if it fails")  # fmt: skip
    ap.add_argument("--kv-budget-gb", type=float, default=None,
                    help="KV memory budget, 1e9 bytes (default: the BF16 paged cache of batch "
                    "x the largest context, all layers)")  # fmt: skip
    ap.add_argument("--no-verify-budget", action="store_true")
    ap.add_argument("--self-test", action="store_true",
                    help="also on CUDA: the decode loop against transformers' forward")  # fmt: skip
    ap.add_argument("--no-graph", action="store_true", help="run the steps eagerly")
    ap.add_argument("--cpu-compile-flex", action="store_true",
                    help="torch.compile FlexAttention on CPU too (slow to compile)")  # fmt: skip
    ap.add_argument("--flex-split-kv", type=int, default=16,
                    help="FlexAttention's SPLIT_KV kernel option (0: torch's choice). 16: the "
                    "strongest BF16 paged peer measured at batch 32 (torch's choice ran 2.5x "
                    "slower at 16k: 18.3 against 7.2 ms a step on the H200)")  # fmt: skip
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    record.add_revision_flag(ap)
    args = ap.parse_args(argv)
    tiny = args.tiny
    args.layers = args.layers or (2 if tiny else 8)
    args.batch = args.batch or (3 if tiny else 32)
    args.contexts = [int(c) for c in (args.contexts or ("64" if tiny else "4096,16384")).split(",")]
    lo, hi = (args.gen_range or ("2:6" if tiny else "16:128")).split(":")
    args.gen_lo, args.gen_hi = int(lo), int(hi)
    args.steps = args.steps if args.steps is not None else (3 if tiny else 32)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 5)
    args.systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad or not 1 <= args.gen_lo <= args.gen_hi or args.guard_steps < 1:
        ap.error(f"bad --systems {bad}, --gen-range or --guard-steps")
    return args


def summarize(runs, args, budget, model):
    """Per context: fp4attn's tokens/s over each peer's, its sequences at the budget over BF16
    paged's, and issue 22's targets at 16k."""
    kv, d, layers = model.kv_heads, model.head_dim, model.n_layers
    summary = {}
    for context in args.contexts:
        by = {r["system"]: r for r in runs if r.get("context") == context}
        s = {}
        ours, bf = by.get("fp4attn-nvfp4", {}), by.get("bf16-paged", {})
        sd = by.get("sdpa-contiguous", {})
        if ours.get("tokens_per_s") and bf.get("tokens_per_s"):
            s["tokens_vs_bf16_paged"] = ours["tokens_per_s"] / bf["tokens_per_s"]
        if ours.get("tokens_per_s") and sd.get("tokens_per_s"):
            s["tokens_vs_sdpa_contiguous"] = ours["tokens_per_s"] / sd["tokens_per_s"]
        seqs = sequences_at_budget(budget, layers, kv, d, context)
        if seqs["bf16-paged"]:
            s["sequences_vs_bf16_paged"] = seqs["fp4attn-nvfp4"] / seqs["bf16-paged"]
        if context == 16384 and not args.tiny:
            s["targets"] = TARGETS
            s["meets_targets"] = all(s.get(k, 0) >= v for k, v in TARGETS.items())
        summary[str(context)] = s
    return summary


def run_systems(args, model, budget, order, runs, warnings, save):
    """Every system at every context (runs, guard comparisons), saving after each."""
    kv, d, layers = model.kv_heads, model.head_dim, model.n_layers
    for context in args.contexts:
        grng = np.random.default_rng(args.seed + 7 + context)
        guard_tokens = [grng.integers(0, model.vocab, size=args.batch)
                        for _ in range(args.guard_steps)]  # fmt: skip
        seqs = sequences_at_budget(budget, layers, kv, d, context)
        log(f"context {context}: batch {args.batch}, sequences at the budget {seqs}")
        guards = {}
        for name in order:
            variants = [None]
            if name == "bf16-paged":
                variants = {"auto": ["flex", "gather"], "flex": ["flex"], "gather": ["gather"]}[
                    args.bf16_paged_attention
                ]
            failures, guard = [], None
            for variant in variants:
                t1 = time.perf_counter()
                try:
                    rec, guard = run_system(name, variant, model, context, args, guard_tokens)
                except Exception as e:
                    failures.append({"attention": variant or name, "error": first_line(e),
                                     "traceback": tail(e)})  # fmt: skip
                    log(f"  {name} ({variant or 'default'}) failed: {first_line(e)}")
                    continue
                rec["wall_s"] = time.perf_counter() - t1
                if failures:
                    rec["fallback_from"] = failures
                    warnings.append(f"{name} at {context}: {failures[0]['attention']} failed "
                                    f"({failures[0]['error']}); ran {variant}")  # fmt: skip
                break
            else:
                rec = {"system": name, "batch": args.batch, "context": context,
                       "error": failures[-1]["error"] if failures else "not run",
                       "failures": failures}  # fmt: skip
                warnings.append(f"{name} at {context}: {rec['error']}")
            rec["sequences_at_budget"] = seqs[name]
            if rec.get("device_errors"):
                warnings.append(f"{name} at {context}: {rec['device_errors']}")
            if rec.get("capture_error"):
                warnings.append(f"{name} at {context}: not graph-captured ({rec['capture_error']})")
            if not rec.get("logits_finite", True):
                warnings.append(f"{name} at {context}: non-finite logits")
            runs.append(rec)
            if guard is not None:
                guards[name] = guard
            if rec.get("tokens_per_s"):
                log(f"  {name}: {rec['tokens_per_s']:.0f} tokens/s, {rec['step_ms']:.3f} ms a "
                    f"step, graph {rec['graph']} ({rec['wall_s']:.0f} s)")  # fmt: skip
            save()
        compare_guards(runs, {(context, k): g for k, g in guards.items()}, context)
        for rec in runs:
            if rec.get("context") == context and rec.get("logits_cos_vs_sdpa") is not None:
                log(f"  {rec['system']}: logits cos vs sdpa {rec['logits_cos_vs_sdpa']:.5f}, "
                    f"attention cos {rec['attn_cos_vs_sdpa']}")  # fmt: skip
        save()


def main(argv=None):
    args = parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("serve_loop.py: no CUDA device (use --device cpu --tiny)")
    torch.manual_seed(args.seed)
    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    runs, warnings = [], []
    doc = record.header("serve", record.revision(args.revision), peers.device_name(),
                        record.command_line(argv))  # fmt: skip
    sw = peers.software()
    try:
        import transformers

        sw["transformers"] = transformers.__version__
    except Exception:
        sw["transformers"] = None
    try:
        import fp4attn

        sw["fp4attn"] = os.path.dirname(fp4attn.__file__)
    except Exception as e:
        sw["fp4attn"] = None
        warnings.append(f"fp4attn not importable: {first_line(e)}")
    doc.update(software=sw, clocks={"before": peers.read_clocks()}, complete=False)
    state = {}

    def save(final=False):
        """The record as it stands (after each system, so a crash or a kill keeps the runs)."""
        if "model" in state:
            doc["summary"] = summarize(runs, args, state["budget"], state["model"])
        doc["runs"], doc["warnings"] = runs, warnings
        doc["total_s"] = time.perf_counter() - t0
        if final:
            doc["clocks"]["after"] = peers.read_clocks()
        record.write_json(doc, args.out, digits=6)

    try:
        spec = TINY if args.tiny else LLAMA31_8B
        order = [s for s in SYSTEMS if s in args.systems]
        max_pos = max(-(-(c + args.gen_hi) // PAGE) * PAGE for c in args.contexts) + PAGE
        log(f"building the model ({args.layers} layers) on {dev}")
        model = Model(spec, args.layers, dev, args.seed, args.init_std, max_pos)
        took = time.perf_counter() - t0
        log(f"model: {model.params / 1e9:.2f} B params, {model.source}; k std "
            f"{model.k_std:.3f}, v std {model.v_std:.3f} ({took:.1f} s)")  # fmt: skip
        if not model.source.startswith("transformers"):
            warnings.append(model.source)
        doc["model"] = model.describe()
        kv, d, layers = model.kv_heads, model.head_dim, model.n_layers
        budget = (
            int(args.kv_budget_gb * 1e9)
            if args.kv_budget_gb
            else args.batch * -(-max(args.contexts) // PAGE) * page_bytes("bf16", kv, d) * layers
        )
        state.update(model=model, budget=budget)
        doc["config"] = {
            "batch": args.batch, "contexts": args.contexts, "page_size": PAGE,
            "prompt": "uniform in [0.75, 1] x context (random KV, std of the model's k/v, one "
            "append per layer; not timed)", "gen_range": [args.gen_lo, args.gen_hi],
            "timed_steps": args.steps, "warmup_steps": args.warmup,
            "guard_steps": args.guard_steps, "seed": args.seed, "init_std": args.init_std,
            "kv_budget_bytes": budget,
            "timing": "CUDA events around each step's metadata copies (staged in pinned memory "
            "before) and graph replay; tokens/s = batch x steps / sum of step times",
            "pages": "random order (shuffled free list), freed pages return to its end",
        }  # fmt: skip
        doc["budget"] = {
            "bytes": budget,
            "sequences_at_budget": {
                str(c): sequences_at_budget(budget, layers, kv, d, c) for c in args.contexts
            },
            "bytes_per_page_per_layer": {f: page_bytes(f, kv, d) for f in ("nvfp4", "bf16")},
            "rule": "sequences of the context: budget // (layers x pages x page bytes); "
            "sdpa-contiguous reserves context tokens per sequence",
        }
        run_systems(args, model, budget, order, runs, warnings, save)
        if not args.no_verify_budget and "fp4attn-nvfp4" in order:
            log(f"verifying the NVFP4 pool of the budget at context {max(args.contexts)}")
            v = verify_budget(model, budget, max(args.contexts))
            doc["budget"]["verified"] = v
            log(f"  {v}")
            if not v.get("decode_ok"):
                warnings.append(f"budget verification failed: {v.get('error', 'bad output')}")
        if args.tiny or args.self_test:
            log("self-test against transformers' forward")
            doc["self_test"] = self_test(model, args, order)
    except Exception as e:  # write what there is, with the error
        doc["fatal_error"] = first_line(e)
        doc["fatal_traceback"] = tail(e, 12)
        warnings.append(f"fatal: {first_line(e)}")
        log(f"fatal: {first_line(e)}")
        save(final=True)
        traceback.print_exc()
        return 2
    doc["complete"] = True
    save(final=True)
    log(f"wrote {args.out} ({doc['total_s']:.0f} s)")
    failed = [r for r in runs if "error" in r]
    return 1 if failed and len(failed) == len(runs) else 0
