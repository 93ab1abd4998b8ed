"""Correctness: the guard steps of each system against sdpa-contiguous's, and the self-test of
the decode loop against transformers' own forward of the same weights."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .common import PAGE, cleanup, first_line, log, tail
from .loop import Loop
from .scheduler import Geometry


def compare_guards(runs, guards, context):
    """logits / attention cosines of each system's guard steps against sdpa-contiguous's."""
    ref = guards.get((context, "sdpa-contiguous"))
    for rec in runs:
        if rec.get("context") != context or rec["system"] == "sdpa-contiguous":
            continue
        got = guards.get((context, rec["system"]))
        if ref is None or got is None or not ref["logits"]:
            rec["logits_cos_vs_sdpa"] = None
            continue
        cos, rows, agree, a0, a1 = [], [], [], [], []
        for g, r, gp, rp in zip(got["logits"], ref["logits"], got["probes"], ref["probes"]):
            g64, r64 = g.double(), r.double()
            cos.append(F.cosine_similarity(g64.flatten(), r64.flatten(), dim=0).item())
            rows.append(F.cosine_similarity(g64, r64, dim=1).min().item())
            agree.append((g.argmax(-1) == r.argmax(-1)).double().mean().item())
            a0.append(F.cosine_similarity(gp[0].double(), rp[0].double(), dim=1).min().item())
            a1.append(F.cosine_similarity(gp[1].double(), rp[1].double(), dim=1).min().item())
        rec["logits_cos_vs_sdpa"] = min(cos)
        rec["logits_cos_vs_sdpa_steps"] = cos
        rec["logits_row_cos_min_vs_sdpa"] = min(rows)
        rec["argmax_agree_vs_sdpa"] = float(np.mean(agree))
        rec["attn_cos_vs_sdpa"] = {"layer0_row_min": min(a0), "last_layer_row_min": min(a1)}


def self_test(model, args, systems):
    """Feeds B2 sequences of T tokens from an empty cache through each system's decode loop
    (eager) and compares each step's logits with transformers' LlamaForCausalLM forward over
    the whole sequence (same weights)."""
    if model.hf is None:
        return {"skipped": "weights not held by transformers modules"}
    dev, b2, t = model.device, 2, 8
    rng = np.random.default_rng(args.seed + 99)
    tokens = rng.integers(0, model.vocab, size=(b2, t))
    with torch.no_grad():
        ref = model.hf(input_ids=torch.from_numpy(tokens).to(dev), use_cache=False).logits.float()
    res = {"tokens": t, "batch": b2}
    hf_inv = getattr(getattr(model.hf.model, "rotary_emb", None), "inv_freq", None)
    if hf_inv is not None:
        res["rope_inv_freq_max_abs_diff_vs_transformers"] = (
            (hf_inv.float().cpu() - model.inv_freq).abs().max().item()
        )
    geo = Geometry(b2, -(-t // PAGE), b2 * -(-t // PAGE) + 1, model.n_layers, model.heads,
                   model.kv_heads, model.head_dim)  # fmt: skip
    for name in systems:
        try:
            loop = Loop(name, None, model, geo, args, args.seed, lambda rng, first: (0, t))
            cos, agree = [], []
            for i in range(t):
                loop.begin(teacher=tokens[:, i])
                loop.upload()
                loop.step()
                got, want = loop.logits.float(), ref[:, i]
                cos.append(F.cosine_similarity(got.double(), want.double(), dim=1).min().item())
                agree.append((got.argmax(-1) == want.argmax(-1)).double().mean().item())
            loop.system.finish()
            res[name] = {"logits_row_cos_min": min(cos), "argmax_agree": float(np.mean(agree)),
                         "attention": loop.system.attention}  # fmt: skip
            loop.close()
        except Exception as e:
            res[name] = {"error": first_line(e), "traceback": tail(e)}
        finally:
            if name == "bf16-paged":
                torch._dynamo.reset()
            cleanup(dev)
        log(f"  self-test {name}: {res[name]}")
    return res
