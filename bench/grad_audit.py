"""Gradient audit for train_gpt.py: at chosen steps, each block's attention gradients from the
backend under test against float64 autograd of exact causal softmax attention, on the very q, k, v
and incoming dO of that training step. It says whether a backend's backward (not its forward, not
the optimizer) is what goes wrong when a run's gradient norm jumps."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class Recorder:
    """Block.forward calls capture(); train_one turns it on for the audited steps only."""

    def __init__(self):
        self.active = False
        self.saved: list[dict] = []

    def capture(self, q, k, v, o):
        if not self.active or not o.requires_grad:
            return
        entry = {"q": q.detach(), "k": k.detach(), "v": v.detach()}
        o.register_hook(lambda g, e=entry: e.__setitem__("do", g.detach()))
        self.saved.append(entry)


def exact_attention(q, k, v):
    """q, k, v [b, s, h, d] (float64): causal softmax attention, the same layout out."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    s = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return (p @ vh).transpose(1, 2)


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Cosine and norm ratio over the whole tensor, and the worst (batch, head) slice of each."""
    a, b = got.double(), ref.double()
    sa, sb = a.transpose(1, 2).flatten(2), b.transpose(1, 2).flatten(2)  # [b, h, s * d]
    slice_ratio = sa.norm(dim=-1) / sb.norm(dim=-1).clamp_min(1e-300)
    return {
        "cos": round(F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item(), 6),
        "norm_ratio": round((a.norm() / b.norm().clamp_min(1e-300)).item(), 5),
        "worst_slice_cos": round(F.cosine_similarity(sa, sb, dim=-1).min().item(), 6),
        "max_slice_norm_ratio": round(slice_ratio.max().item(), 5),
    }


def audit(attention_fn, saved: list[dict]) -> list[dict]:
    """One dict per captured block: o, dq, dk, dv compared with float64, plus the magnitudes that
    set the backward's scales (largest |score|, |dO|)."""
    out = []
    for e in saved:
        if "do" not in e:
            continue
        leaves = [t.clone().requires_grad_() for t in (e["q"], e["k"], e["v"])]
        o = attention_fn(*leaves)
        grads = torch.autograd.grad(o, leaves, e["do"])
        ref_leaves = [t.double().requires_grad_() for t in (e["q"], e["k"], e["v"])]
        o_ref = exact_attention(*ref_leaves)
        ref_grads = torch.autograd.grad(o_ref, ref_leaves, e["do"].double())
        r = {"o": compare(o.detach(), o_ref.detach())}
        for name, g, gr in zip(("dq", "dk", "dv"), grads, ref_grads):
            r[name] = compare(g, gr)
        # Softmax ignores a constant added to a row's scores, so a key bias (the same vector
        # added to every key of a head) has exactly zero gradient: sum_j dK_j = sum_i (sum_j
        # dS_ij) q_i = 0. A backward whose dS rows do not sum to zero pushes it anyway.
        for name, g in (("dk_sum_share", grads[1]), ("dk_sum_share_ref", ref_grads[1])):
            g = g.double()
            r[name] = float(g.sum(dim=1).norm() / g.norm().clamp_min(1e-300))
        qh, kh = e["q"].transpose(1, 2).float(), e["k"].transpose(1, 2).float()
        r["score_amax"] = round(
            ((qh @ kh.transpose(-1, -2)).abs().max() / math.sqrt(qh.shape[-1])).item(), 3
        )
        r["do_amax"] = float(e["do"].abs().max().item())
        out.append(r)
    return out


def summary(step: int, layers: list[dict]) -> str:
    """One line: the worst layer's cosines and norm ratios."""

    def worst(key, field, fn):
        return fn(layer[key][field] for layer in layers)

    parts = [f"audit step {step}:"]
    for key in ("o", "dq", "dk", "dv"):
        parts.append(
            f"{key} cos {worst(key, 'cos', min):.4f} (slice {worst(key, 'worst_slice_cos', min):.4f})"
            f" norm x{worst(key, 'norm_ratio', max):.3g}"
        )
    parts.append(f"|s|max {max(layer['score_amax'] for layer in layers):.1f}")
    parts.append(
        f"|sum dK|/|dK| {max(layer['dk_sum_share'] for layer in layers):.3g}"
        f" (float64 {max(layer['dk_sum_share_ref'] for layer in layers):.2g})"
    )
    return "  ".join(parts)
