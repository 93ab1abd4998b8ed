#!/usr/bin/env python3
"""Training evidence for issue 8: a small GPT trained with each attention backend, same seeds.

Byte-level language model on the Python standard library's own sources (the only sizeable real
text on an offline device; files split train / held-out by name hash), identical initialization,
data order and optimizer per run; only the attention differs:

* ``sdpa``          torch SDPA in the model dtype (BF16 on the GPU): the baseline;
* an fp4attn recipe (``nvfp4``, ``fp8``, ``mxfp4``, ...) through ``fp4attn.attn_func``: its
  forward kernel and its backward (GPU backward for the exp2 recipes, golden model on CPU);
* ``emu-mxfp4-pv``  materialized attention with P and V fake-quantized to MXFP4 (32-element
  E8M0 blocks, exponent ceil(log2(amax / 6)), E2M1 round-to-nearest-even, straight-through gradients): the seed paper's
  MXFP4-P/V training mode, emulated in torch because the engine's MXFP4-P recipes (fp4-direct,
  nvfp4-all) have no GPU backward yet.

Writes a JSON record (loss curves, final train / held-out losses, gaps to ``sdpa``, divergence)
and, with matplotlib, a PNG of the curves:

    python3 bench/train_gpt.py --out bench/results/training.json --steps 3000
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import sysconfig
import time
import zlib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grad_audit  # --audit-every: attention gradients against float64 during training
import record  # the record's head and file

# ---- data ------------------------------------------------------------------------------------


def load_corpus(root: str | None, max_bytes: int):
    """Bytes of the stdlib's .py files: (train, held-out), split by a hash of the file name."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    if not files:
        raise SystemExit(f"--corpus: no .py files under {root}")
    train, held = bytearray(), bytearray()
    for path in files:
        if len(train) + len(held) >= max_bytes and held:  # at least one held-out file
            break
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        # 1 file in 20 is held out: a stable split that needs no state.
        (held if zlib.crc32(os.path.relpath(path, root).encode()) % 20 == 0 else train).extend(data)

    def as_tensor(b):
        return torch.frombuffer(bytes(b), dtype=torch.uint8).long()

    return as_tensor(train), as_tensor(held), root, len(files)


def batch(data: torch.Tensor, n: int, seq: int, gen: torch.Generator, device):
    starts = torch.randint(0, data.numel() - seq - 1, (n,), generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1)
    chunk = data[idx].to(device)
    return chunk[:, :-1], chunk[:, 1:]


# ---- MXFP4 fake quantization (emu-mxfp4-pv) --------------------------------------------------

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """|x| <= 6 to the E2M1 grid, round to nearest, ties to the even code (0, 1, 2, 4 win)."""
    grid = torch.tensor(E2M1, dtype=x.dtype, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    a = x.abs().contiguous()
    i = torch.bucketize(a, mids)  # a == mid goes down
    # Ties whose lower neighbour has an odd code (0.5, 1.5, 3) go up to the even one.
    odd_below = torch.tensor([False, True, False, True, False, True, False], device=x.device)
    tie_up = (i < 7) & (a == mids[i.clamp(max=6)]) & odd_below[i.clamp(max=6)]
    return torch.sign(x) * grid[i + tie_up.long()]


def mxfp4_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    """MXFP4 along `dim` (blocks of 32, zero-padded), straight-through gradient. The shared
    exponent is fp4attn's default rule, ceil(log2(amax / 6)) (nothing saturates), not OCP's
    floor(log2 amax) - 2 (which clamps values in (6, 8) x scale to 6)."""
    xt = x.float().transpose(dim, -1)
    n = xt.shape[-1]
    pad = (-n) % 32
    xb = F.pad(xt, (0, pad)).unflatten(-1, (-1, 32))
    amax = xb.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp_min(2.0**-126) / 6)), 0.0)
    scale = torch.exp2(e)
    q = e2m1_round((xb / scale).clamp(-6, 6)) * scale
    q = q.flatten(-2)[..., :n].transpose(dim, -1).to(x.dtype)
    return x + (q - x).detach()


def emu_mxfp4_pv_attention(q, k, v):
    """q, k, v [b, s, h, d]: causal softmax attention with MXFP4 P (along keys) and V (along
    tokens), FP32 scores."""
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    s = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    o = mxfp4_fake(p, -1) @ mxfp4_fake(vh, -2)
    return o.transpose(1, 2).to(q.dtype)


# ---- model -----------------------------------------------------------------------------------


D_SOURCE = {"value": "forward-o"}  # --d-source: the O of the backward's D = rowsum(dO * O)
AUDIT = grad_audit.Recorder()  # --audit-every


def attention(q, k, v, backend: str):
    if backend == "sdpa":
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return o.transpose(1, 2)
    if backend == "emu-mxfp4-pv":
        return emu_mxfp4_pv_attention(q, k, v)
    import fp4attn

    return fp4attn.attn_func(q, k, v, causal=True, recipe=backend, d_source=D_SOURCE["value"])


class Block(torch.nn.Module):
    def __init__(self, d_model: int, heads: int, backend: str):
        super().__init__()
        self.heads, self.backend = heads, backend
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d_model, 4 * d_model),
            torch.nn.GELU(),
            torch.nn.Linear(4 * d_model, d_model),
        )

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, c // self.heads).unbind(2)
        o = attention(q, k, v, self.backend)
        AUDIT.capture(q, k, v, o)
        x = x + self.proj(o.reshape(b, s, c))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, layers, d_model, heads, seq, backend):
        super().__init__()
        self.tok = torch.nn.Embedding(256, d_model)
        self.pos = torch.nn.Embedding(seq, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads, backend) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, 256, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def key_bias_norm(model) -> float:
    """The largest norm over blocks of the K part of the qkv bias: a parameter the loss does not
    depend on (softmax ignores a per-row constant), so only a backward error moves it (beyond
    weight decay's pull to zero)."""
    with torch.no_grad():
        return max(
            blk.qkv.bias[blk.qkv.out_features // 3 : 2 * blk.qkv.out_features // 3]
            .float()
            .norm()
            .item()
            for blk in model.blocks
        )


# ---- training --------------------------------------------------------------------------------


def train_one(backend, args, train, held, device, dtype):
    torch.manual_seed(args.seed)  # same initial weights for every backend
    model = GPT(args.layers, args.d_model, args.heads, args.seq, backend).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda i: min(1.0, (i + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * i / args.steps)),
    )
    gen = torch.Generator().manual_seed(args.seed + 1)  # same batches for every backend
    held_gen_seed = args.seed + 2

    def held_out_loss():
        g = torch.Generator().manual_seed(held_gen_seed)  # the same held-out batches each time
        model.eval()
        with torch.no_grad():
            losses = [
                F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).item()
                for x, y in (
                    batch(held, args.batch, args.seq, g, device) for _ in range(args.eval_batches)
                )
            ]
        model.train()
        return sum(losses) / len(losses)

    curve, held_curve, grad_norms, diverged, out_of_time = [], [], [], False, False
    audits, key_bias_norms = [], []
    window, window_gn = [], []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batch(train, args.batch, args.seq, gen, device)
        AUDIT.active, AUDIT.saved = args.audit_every > 0 and step % args.audit_every == 0, []
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if AUDIT.active:
            AUDIT.active = False
            layers = grad_audit.audit(lambda q, k, v: attention(q, k, v, backend), AUDIT.saved)
            audits.append([step, layers])
            print(f"  {backend:14s} {grad_audit.summary(step, layers)}", flush=True)
        window_gn.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        sched.step()
        window.append(loss.item())
        if not math.isfinite(window[-1]):
            diverged = True
            curve.append([step, None])
            break
        if step % args.log_every == 0 or step == args.steps:
            curve.append([step, sum(window) / len(window)])
            # The largest pre-clip norm of the window, read once per window (one sync, not one a step).
            grad_norms.append([step, torch.stack(window_gn).max().item()])
            window, window_gn = [], []
            key_bias_norms.append([step, key_bias_norm(model)])
        out_of_time = args.max_minutes > 0 and time.perf_counter() - t0 > 60 * args.max_minutes
        if out_of_time and window:
            curve.append([step, sum(window) / len(window)])
            grad_norms.append([step, torch.stack(window_gn).max().item()])
            window, window_gn = [], []
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            held_curve.append([step, held_out_loss()])
            print(
                f"  {backend:14s} step {step:6d} train {curve[-1][1]:.4f} "
                f"held-out {held_curve[-1][1]:.4f}",
                flush=True,
            )
        if out_of_time:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    finite = [c for _, c in curve if c is not None]
    return {
        "backend": backend,
        "steps_run": step,
        "diverged": diverged,
        "stopped_by_time": out_of_time,
        "curve": curve,
        "held_out_curve": held_curve,
        "max_grad_norm_curve": grad_norms,
        "grad_audit": audits,
        "key_bias_norm_curve": key_bias_norms,
        "final_train_loss": finite[-1] if finite and not diverged else None,
        "final_held_out_loss": held_curve[-1][1] if held_curve and not diverged else None,
        "seconds": round(seconds, 2),
        "ms_per_step": round(1000 * seconds / step, 2),
    }


def plot(doc, png):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_gpt: no matplotlib, no PNG")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in doc["runs"]:
        pts = [(s, c) for s, c in run["curve"] if c is not None]
        (line,) = ax.plot(*zip(*pts), label=f"{run['backend']} train", lw=1)
        if run["held_out_curve"]:
            ax.plot(
                *zip(*run["held_out_curve"]),
                "o--",
                color=line.get_color(),
                ms=3,
                label=f"{run['backend']} held-out",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    c = doc["config"]
    ax.set_title(
        f"byte-level GPT {c['layers']}x{c['d_model']}, {c['heads']} heads, seq {c['seq']}"
        f" ({doc['device']})"
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"train_gpt: wrote {png}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="training.json")
    ap.add_argument("--png", default=None, help="default: --out with .png")
    ap.add_argument("--backends", default="sdpa,nvfp4,fp8,mxfp4,emu-mxfp4-pv")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="head_dim = d_model / heads: 64 or 128")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--d-source",
        default="forward-o",
        choices=["forward-o", "high-precision-o"],
        help="fp4attn backends: the O of the backward's D (docs/numerics.md §8)",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=0,
        help="stop each run after this long (0: no limit); its steps_run says where",
    )
    ap.add_argument(
        "--audit-every",
        type=int,
        default=0,
        help="every N steps, each block's attention gradients vs float64 (0: never)",
    )
    ap.add_argument("--corpus", default=None, help="directory of .py files (default: the stdlib)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    record.add_revision_flag(ap)
    args = ap.parse_args(argv)
    if args.d_model % args.heads or args.d_model // args.heads not in (64, 128):
        ap.error("--d-model / --heads: the head dim must be 64 or 128")

    D_SOURCE["value"] = args.d_source
    device = torch.device(args.device)
    # BF16 on the GPU (fp4attn's CUDA inputs); float32 on the CPU (the golden model's path).
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    train, held, root, nfiles = load_corpus(args.corpus, args.max_bytes)
    print(
        f"train_gpt: {nfiles} files under {root}: {train.numel()} train / {held.numel()} "
        f"held-out bytes; {args.device}, {dtype}",
        flush=True,
    )
    runs = []
    for backend in args.backends.split(","):
        print(f"train_gpt: {backend}", flush=True)
        runs.append(train_one(backend, args, train, held, device, dtype))
    base = next((r for r in runs if r["backend"] == "sdpa" and not r["diverged"]), None)
    for r in runs:
        if base and r["final_held_out_loss"] is not None:
            r["held_out_gap_vs_sdpa"] = round(
                r["final_held_out_loss"] - base["final_held_out_loss"], 5
            )
            r["train_gap_vs_sdpa"] = round(r["final_train_loss"] - base["final_train_loss"], 5)
    doc = record.header(
        "training",
        record.revision(args.revision),
        torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        record.command_line(argv, __file__),
    )
    doc |= {
        "software": {"torch": torch.__version__},
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "png", "revision")}
        | {
            "corpus_root": root,
            "corpus_files": nfiles,
            "train_bytes": int(train.numel()),
            "held_out_bytes": int(held.numel()),
            "dtype": str(dtype).replace("torch.", ""),
        },
        "runs": runs,
    }
    record.write_json(doc, args.out)
    print(f"train_gpt: wrote {args.out}")
    for r in runs:
        print(
            f"  {r['backend']:14s} train {r['final_train_loss']} held-out {r['final_held_out_loss']}"
            f" gap {r.get('held_out_gap_vs_sdpa')} diverged {r['diverged']} {r['ms_per_step']} ms/step"
        )
    plot(doc, args.png or os.path.splitext(args.out)[0] + ".png")
    return doc


if __name__ == "__main__":
    main()
