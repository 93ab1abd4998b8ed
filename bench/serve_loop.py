#!/usr/bin/env python3
"""A decoder LLM generation loop with continuous batching, with its KV cache in fp4attn's NVFP4
paged cache, beside the same model with a BF16 paged cache and with SDPA on a contiguous BF16
cache (issue 22, item 3; the record bench/results/serve.json).

The model: a Llama-3.1-8B-architecture decoder from transformers.LlamaConfig (hidden 4096, MLP
14336, 32/8 heads, d = 128, vocab 128256, RoPE theta 500000 with Llama 3.1's frequency scaling),
--layers of its layers (default 8), random bfloat16 weights made on the device (transformers'
LlamaForCausalLM modules hold them, re-initialised here from a seeded normal(0, 0.02), norms 1).
The decode step is our own minimal forward over those weights: embedding, per layer RMSNorm,
q/k/v projections, RoPE at each sequence's own position, append + attention over the cache,
o_proj, RMSNorm, SwiGLU MLP; final RMSNorm, lm_head, greedy argmax. Every per-step tensor is
static, so the whole step (all layers, append, attention, MLP, lm_head, argmax) is captured in
ONE CUDA graph and replayed; before each replay the host scheduler writes the step's page
tables, lengths, slots, positions and new-sequence tokens into the static tensors (pinned
staging buffers, non_blocking copies, outside the graph).

Continuous batching: --batch slots; each holds a sequence whose cached prompt is drawn in
[0.75, 1] x context and which generates a number of tokens drawn from --gen-range; the first
sequences start part-way through their generation, so replacements are spread over the steps.
A finished sequence's pages go back to the free list (pages in random order) and a new
sequence takes its slot: its prompt's KV is random data (std of the model's own k/v) written
with one append per layer (fp4attn: one append_kv call), which is not timed: prefill compute is
not what this measures. Every decode step runs the real model.

Systems (same weights, same scheduler and seeds, page size 16):
* fp4attn-nvfp4: per layer PagedKVCache.empty(format="nvfp4") (globals supplied: 2688 / (8
  std)), append_kv(cache, k, v, int64 slots), then one DecodePlan (capacity = the slot's page
  capacity) whose run(q, cache, block_tables, seq_lens, out=...) serves all layers and steps.
* bf16-paged: BF16 pages [num_pages, 16, 8, 128] per layer for K and V (vLLM's NHD layout),
  written by index_copy_ of the new tokens' slots; attended by torch FlexAttention
  (torch.compile, the flex-decoding kernel) on the pool viewed as [1, 8, num_pages * 16, 128]
  with a BlockMask built from the page table (kv_indices = the sequence's page ids,
  kv_num_blocks = its page count: it reads only its own pages, each byte once) and a mask_mod
  that keeps a key iff its page belongs to the sequence and its logical position is below the
  length (so the last page's tail is masked, and the mask alone is right even where the block
  sparsity is not used, as in eager CPU flex). If FlexAttention fails, the pages are gathered
  into a contiguous copy per layer and attended by SDPA ("attention" says which ran).
* sdpa-contiguous: a contiguous BF16 cache [batch, 8, max_len, 128] per layer, the new token
  written at its position, attended by torch SDPA (cuDNN if it takes a boolean length mask, else
  the efficient backend; "sdpa_backend" says which) with q as [b, 8, 4, 128] (a GQA group's 4
  query heads as 4 query rows) and a boolean mask [b, 1, 1, max_len]; it reads max_len tokens
  of every sequence.

Measured per context (--contexts, default 4096,16384) and system: tokens/s = batch x timed
steps / (sum over the timed steps of the GPU time between CUDA events around the metadata
copies and the graph replay), after --warmup steps; the prompt fills of replaced sequences
happen before a step's first event. tokens_per_s_wall also counts the host scheduling and the
fills. Correctness guard: the first --guard-steps steps of every system run from the same state
with the same (teacher-forced) tokens; logits_cos_vs_sdpa is the smallest cosine of a step's
logits against sdpa-contiguous's (attn_cos_vs_sdpa: the attention outputs of the first and last
layer). sequences_at_budget: sequences of the context that each format's cache holds in
--kv-budget-gb (default: what the BF16 paged cache needs for batch x the largest context, all
layers), from the bytes per page (NVFP4: per kv head 64 data + 8 scale bytes for K and V each;
BF16: 256 each) and page rounding; the NVFP4 pool of that size is then allocated and decoded
over (the largest context) to verify it.

    python3 bench/serve_loop.py OUT.json [--contexts 4096,16384] [--layers 8] [--batch 32]
    python3 bench/serve_loop.py OUT.json --device cpu --tiny      # the logic on CPU, no graph

--device cpu --tiny: a small model (hidden 256, 4/2 heads, d = 64, 2 layers, vocab 1000),
batch 3, context 64, 3 steps, every system on CPU (fp4attn's golden path, eager FlexAttention),
plus a self-test of the decode forward against transformers' own forward of the same weights.
"""

from __future__ import annotations

import argparse
import collections
import gc
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import peers  # device name, software versions, clocks
import record  # the records' shared head and file writing
import torch
import torch.nn.functional as F

PAGE = 16
SYSTEMS = ("sdpa-contiguous", "fp4attn-nvfp4", "bf16-paged")  # the reference runs first
NVFP4_SCALE = 2688.0  # 448 * 6: s_enc = 2688 / amax (docs/kernels/decode.md)
TARGETS = {"tokens_vs_bf16_paged": 1.3, "sequences_vs_bf16_paged": 3.3}  # issue 22, at 16k

# Llama-3.1-8B; rope: Llama 3.1's frequency scaling (rope_type "llama3").
LLAMA31_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rope_scaling=dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
)
TINY = dict(
    LLAMA31_8B,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1000,
)


def log(msg):
    print(f"[serve] {msg}", flush=True)


def first_line(e):
    text = f"{type(e).__name__}: {e}"
    return (text.splitlines() or [type(e).__name__])[0][:300]


def tail(e, lines=6):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).splitlines()[-lines:]


# ---------------------------------------------------------------------------------------------
# The model


def llama_config(spec, layers):
    """transformers.LlamaConfig of spec with `layers` layers (RoPE parameters in v5's
    rope_parameters, or v4's rope_theta / rope_scaling)."""
    import transformers
    from transformers import LlamaConfig

    common = {k: v for k, v in spec.items() if k not in ("rope_theta", "rope_scaling")}
    common.update(num_hidden_layers=layers, tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, hidden_act="silu")  # fmt: skip
    scaling = spec["rope_scaling"]
    if int(transformers.__version__.split(".")[0]) >= 5:
        rope = dict(scaling or {"rope_type": "default"}, rope_theta=spec["rope_theta"])
        return LlamaConfig(**common, rope_parameters=rope)
    return LlamaConfig(**common, rope_theta=spec["rope_theta"], rope_scaling=scaling)


def rope_inv_freq(head_dim, theta, scaling):
    """RoPE's inverse frequencies, with Llama 3.1's scaling when given: wavelengths above
    original / low_freq_factor are divided by factor, those below original / high_freq_factor
    kept, the band between interpolated linearly in original / wavelength."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling or scaling.get("rope_type", "default") == "default":
        return inv
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    band = (wavelen <= orig / low) & (wavelen >= orig / high)
    return torch.where(band, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rms_norm(x, w, eps):
    """Llama's RMSNorm: float32 statistics, the weight applied in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x, cos, sin):
    """x [b, heads, d] rotated by its sequence's position (cos, sin [b, 1, d]; halves
    convention, as transformers' Llama)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Model:
    """Weights of a Llama decoder and a one-token decode step over them.

    The weights live in transformers' LlamaForCausalLM modules (self.hf), made on the device in
    bfloat16 and re-initialised here (seeded, so every run has the same model); without
    transformers, tensors of the same shapes are made directly (source says which)."""

    def __init__(self, spec, layers, device, seed, init_std, max_pos):
        self.spec, self.device, self.dtype = dict(spec), device, torch.bfloat16
        self.hidden = spec["hidden_size"]
        self.heads = spec["num_attention_heads"]
        self.kv_heads = spec["num_key_value_heads"]
        self.head_dim = spec["head_dim"]
        self.vocab = spec["vocab_size"]
        self.eps = spec["rms_norm_eps"]
        self.n_layers = layers
        self.hf, self.config, self.source = None, None, "own tensors"
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        try:
            self._from_transformers(layers)
        except Exception as e:  # no transformers, or an API it lacks: same shapes, own tensors
            self.source = f"own tensors (transformers failed: {first_line(e)})"
            self._own_tensors(layers)
        with torch.no_grad():
            for _, p in self._named():
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, init_std, generator=gen)
        self.params = sum(p.numel() for _, p in self._named())
        inv = rope_inv_freq(self.head_dim, spec["rope_theta"], spec["rope_scaling"])
        self.inv_freq = inv
        freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)
        # The std of k and v (the same in every layer: RMSNorm feeds the projections), for the
        # random prompt KV and the NVFP4 globals.
        with torch.no_grad():
            ids = torch.randint(0, self.vocab, (256,), generator=gen, device=device)
            x = rms_norm(F.embedding(ids, self.embed), self.layers[0]["ln1"], self.eps)
            self.k_std = F.linear(x, self.layers[0]["wk"]).float().std().item()
            self.v_std = F.linear(x, self.layers[0]["wv"]).float().std().item()

    def _from_transformers(self, layers):
        import transformers
        from transformers import LlamaForCausalLM

        self.config = llama_config(self.spec, layers)
        old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                hf = LlamaForCausalLM(self.config)
        finally:
            torch.set_default_dtype(old)
        hf.eval().requires_grad_(False)
        for prm in hf.parameters():  # not hf.to(): that would round RoPE's float32 inv_freq
            if prm.dtype != self.dtype:
                prm.data = prm.data.to(self.dtype)
        m = hf.model
        self.embed, self.norm = m.embed_tokens.weight, m.norm.weight
        self.lm_head = hf.lm_head.weight
        self.layers = [
            dict(wq=ly.self_attn.q_proj.weight, wk=ly.self_attn.k_proj.weight,
                 wv=ly.self_attn.v_proj.weight, wo=ly.self_attn.o_proj.weight,
                 wg=ly.mlp.gate_proj.weight, wu=ly.mlp.up_proj.weight,
                 wd=ly.mlp.down_proj.weight, ln1=ly.input_layernorm.weight,
                 ln2=ly.post_attention_layernorm.weight)
            for ly in m.layers
        ]  # fmt: skip
        self.hf = hf
        self.source = f"transformers {transformers.__version__} LlamaForCausalLM modules"

    def _own_tensors(self, layers):
        h, i, d = self.hidden, self.spec["intermediate_size"], self.head_dim
        q, kv = self.heads * d, self.kv_heads * d

        def t(*shape):
            return torch.empty(shape, dtype=self.dtype, device=self.device)

        self.embed, self.norm, self.lm_head = t(self.vocab, h), t(h), t(self.vocab, h)
        self.layers = [
            dict(wq=t(q, h), wk=t(kv, h), wv=t(kv, h), wo=t(h, q), wg=t(i, h), wu=t(i, h),
                 wd=t(h, i), ln1=t(h), ln2=t(h))
            for _ in range(layers)
        ]  # fmt: skip

    def _named(self):
        yield "embed", self.embed
        for n, ly in enumerate(self.layers):
            for k in sorted(ly):
                yield f"layers.{n}.{k}", ly[k]
        yield "norm", self.norm
        yield "lm_head", self.lm_head

    def describe(self):
        s = self.spec
        return {
            "architecture": "Llama-3.1-8B (transformers.LlamaConfig), first layers only",
            "hidden_size": s["hidden_size"],
            "intermediate_size": s["intermediate_size"],
            "num_attention_heads": s["num_attention_heads"],
            "num_key_value_heads": s["num_key_value_heads"],
            "head_dim": s["head_dim"],
            "vocab_size": s["vocab_size"],
            "rms_norm_eps": s["rms_norm_eps"],
            "rope_theta": s["rope_theta"],
            "rope_scaling": s["rope_scaling"],
            "layers": self.n_layers,
            "params": self.params,
            "dtype": "bfloat16",
            "weights": f"{self.source}; random normal(0, init_std), norms 1, seeded; no download",
            "k_std": self.k_std,
            "v_std": self.v_std,
            "forward": "own decode step (RMSNorm, RoPE per position, GQA attention over the "
            "cache, SwiGLU, lm_head, greedy argmax) over those weights",
        }

    def decode(self, ids, pos, attend, probes=None):
        """Logits [b, vocab] of one new token per sequence: ids, pos int64 [b]; attend(layer, q
        [b, heads, d], k, v [b, kv_heads, d]) appends k, v to the layer's cache and returns the
        attention output [b, heads * d]; probes [2, b, heads * d] receive the first and the last
        layer's attention output."""
        b, d = ids.shape[0], self.head_dim
        h = F.embedding(ids, self.embed)
        cos = self.cos[pos].to(h.dtype).unsqueeze(1)
        sin = self.sin[pos].to(h.dtype).unsqueeze(1)
        last = len(self.layers) - 1
        for i, w in enumerate(self.layers):
            x = rms_norm(h, w["ln1"], self.eps)
            q = rope(F.linear(x, w["wq"]).view(b, self.heads, d), cos, sin)
            k = rope(F.linear(x, w["wk"]).view(b, self.kv_heads, d), cos, sin)
            v = F.linear(x, w["wv"]).view(b, self.kv_heads, d)
            o = attend(i, q, k, v)
            if probes is not None and i == 0:
                probes[0].copy_(o)
            if probes is not None and i == last:
                probes[1].copy_(o)
            h = h + F.linear(o, w["wo"])
            x = rms_norm(h, w["ln2"], self.eps)
            h = h + F.linear(F.silu(F.linear(x, w["wg"])) * F.linear(x, w["wu"]), w["wd"])
        return F.linear(rms_norm(h, self.norm, self.eps), self.lm_head)


# ---------------------------------------------------------------------------------------------
# Scheduling: slots, pages, and the per-step tensors


@dataclass
class Geometry:
    batch: int
    max_pages: int  # pages one sequence may hold (the DecodePlan's capacity)
    num_pages: int  # pages in a layer's pool
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def max_len(self):
        return self.max_pages * PAGE

    @property
    def group(self):
        return self.heads // self.kv_heads

    @property
    def scale(self):
        return self.head_dim**-0.5


def geometry(model, batch, context, gen_hi):
    max_pages = -(-(context + gen_hi) // PAGE)
    return Geometry(batch, max_pages, batch * max_pages + 1, model.n_layers, model.heads,
                    model.kv_heads, model.head_dim)  # fmt: skip


def benchmark_draw(context, gen_lo, gen_hi):
    """(cached tokens, final length) of a new sequence: prompt in [0.75, 1] x context, gen_lo to
    gen_hi new tokens; the first sequences start part-way through their generation."""

    def draw(rng, first):
        prompt = int(rng.integers(max(1, (3 * context) // 4), context + 1))
        gen = int(rng.integers(gen_lo, gen_hi + 1))
        done = int(rng.integers(0, gen)) if first else 0
        return prompt + done, prompt + gen

    return draw


class Scheduler:
    """The host side of continuous batching: which sequence each slot holds, its pages (from a
    free list in random order), and the step's slot mapping, positions, lengths, page tables
    and new-sequence tokens, in numpy arrays the StepMeta uploads."""

    def __init__(self, geo, vocab, seed, draw):
        self.geo, self.vocab, self.draw = geo, vocab, draw
        self.rng = np.random.default_rng(seed)
        b = geo.batch
        self.free = collections.deque(int(p) for p in self.rng.permutation(geo.num_pages))
        self.block_tables = np.zeros((b, geo.max_pages), np.int32)
        self.owner = np.full(geo.num_pages, -1, np.int32)  # slot holding the page, -1 free
        self.logical = np.zeros(geo.num_pages, np.int32)  # the page's index in its sequence
        self.pages = [[] for _ in range(b)]
        self.cur = np.zeros(b, np.int64)  # tokens in the cache
        self.target = np.zeros(b, np.int64)  # final length
        self.slots = np.zeros(b, np.int64)
        self.pos = np.zeros(b, np.int64)
        self.seq_lens = np.zeros(b, np.int32)
        self.fresh_ids = np.zeros(b, np.int64)
        self.fresh_mask = np.zeros(b, np.int64)
        self.pending = {}  # slot -> first token of a new sequence
        self.fills = []  # (slot, tokens, event id, slots int64) to write before the next step
        self.events = 0
        self.replaced = 0
        for s in range(b):
            self._start(s, first=True)

    def _alloc(self, s):
        page = self.free.popleft()  # IndexError: the pool is too small (a sizing bug)
        j = len(self.pages[s])
        self.pages[s].append(page)
        self.block_tables[s, j] = page
        self.owner[page] = s
        self.logical[page] = j

    def _start(self, s, first):
        for page in self.pages[s]:
            self.owner[page] = -1
            self.free.append(page)
        self.pages[s] = []
        self.block_tables[s] = 0  # entries past a sequence's pages are never read; 0 is valid
        n, target = self.draw(self.rng, first)
        if not (0 <= n < target <= self.geo.max_len):
            raise ValueError(f"draw gave cached {n}, target {target}, max {self.geo.max_len}")
        for _ in range(-(-n // PAGE)):
            self._alloc(s)
        self.cur[s], self.target[s] = n, target
        if n:
            j = np.arange(n)
            pages = np.asarray(self.pages[s], np.int64)
            self.fills.append((s, n, self.events, pages[j // PAGE] * PAGE + j % PAGE))
            self.events += 1
        self.pending[s] = int(self.rng.integers(0, self.vocab))

    def begin_step(self, teacher=None):
        """Replaces finished sequences, then lays out the step (one new token per slot, its KV
        appended at position cur). teacher: tokens [batch] to feed instead of the previous
        step's argmax. Returns the prompt fills to write first."""
        for s in range(self.geo.batch):
            if self.cur[s] >= self.target[s]:
                self._start(s, first=False)
                self.replaced += 1
        for s in range(self.geo.batch):
            p = int(self.cur[s])
            if p // PAGE >= len(self.pages[s]):
                self._alloc(s)
            self.slots[s] = self.pages[s][p // PAGE] * PAGE + p % PAGE
            self.pos[s] = p
            self.seq_lens[s] = p + 1
            self.cur[s] = p + 1
        self.fresh_mask[:] = 0
        for s, tok in self.pending.items():
            self.fresh_ids[s], self.fresh_mask[s] = tok, 1
        self.pending = {}
        if teacher is not None:
            self.fresh_ids[:] = teacher
            self.fresh_mask[:] = 1
        fills, self.fills = self.fills, []
        return fills


class StepMeta:
    """The static device tensors a step reads, packed in two buffers (one or two copies per
    step) with views for each: int64 slots / pos / fresh_ids / fresh_mask [batch]; int32
    seq_lens [batch], block_tables [batch, max_pages], page owner and logical index [num_pages].
    The host stages them in pinned buffers used in turn, each reused only after its last copy
    has run (an event), so that a queued copy never reads a buffer being rewritten."""

    def __init__(self, geo, device, ring=3):
        b, p, n = geo.batch, geo.max_pages, geo.num_pages
        self.geo = geo
        self.n32 = b + b * p + 2 * n
        self.i64 = torch.zeros(4, b, dtype=torch.int64, device=device)
        self.i32 = torch.zeros(self.n32, dtype=torch.int32, device=device)
        self.slots, self.pos, self.fresh_ids, self.fresh_mask = self.i64.unbind(0)
        self.seq_lens = self.i32[:b]
        self.block_tables = self.i32[b : b + b * p].view(b, p)
        self.owner = self.i32[b + b * p : b + b * p + n]
        self.logical = self.i32[b + b * p + n :]
        cuda = device.type == "cuda"
        self.ring = []
        for _ in range(ring if cuda else 1):
            h64 = torch.zeros(4, b, dtype=torch.int64, pin_memory=cuda)
            h32 = torch.zeros(self.n32, dtype=torch.int32, pin_memory=cuda)
            self.ring.append((h64, h32, torch.cuda.Event() if cuda else None))
        self.turn = 0

    def stage(self, sched, n32):
        """Writes the scheduler's arrays into the next pinned buffer (the first n32 int32
        entries: what the system reads); send() then queues the copies. Host work only, so a
        timed window can start after it."""
        b, p, n = self.geo.batch, self.geo.max_pages, self.geo.num_pages
        h64, h32, ev = self.ring[self.turn]
        self.turn = (self.turn + 1) % len(self.ring)
        if ev is not None:
            ev.synchronize()
        a64 = h64.numpy()
        a64[0], a64[1], a64[2], a64[3] = sched.slots, sched.pos, sched.fresh_ids, sched.fresh_mask
        a32 = h32.numpy()
        a32[:b] = sched.seq_lens
        if n32 > b:
            a32[b : b + b * p] = sched.block_tables.reshape(-1)
        if n32 > b + b * p:
            a32[b + b * p : b + b * p + n] = sched.owner
            a32[b + b * p + n :] = sched.logical
        self.staged = (h64, h32, ev, n32)

    def send(self):
        h64, h32, ev, n32 = self.staged
        self.i64.copy_(h64, non_blocking=True)
        self.i32[:n32].copy_(h32[:n32], non_blocking=True)
        if ev is not None:
            ev.record()


# ---------------------------------------------------------------------------------------------
# The systems: how each one stores and attends the KV cache


def pick_sdpa_backend(q, k, v, mask, scale):
    """The SDPA backend for these shapes: cuDNN, else efficient, else math — the first that
    runs them and, on a small random case with a length mask, agrees with float32 attention.
    Returns (backend or None on CPU, its name, why the others were passed over)."""
    if q.device.type != "cuda":
        return None, "cpu (torch's choice)", {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=q.device)
    g.manual_seed(1)
    b, hk, grp, d = 2, k.shape[1], q.shape[2], q.shape[3]
    qs = torch.randn(b, hk, grp, d, generator=g, device=q.device, dtype=q.dtype)
    ks = torch.randn(b, hk, 64, d, generator=g, device=q.device, dtype=q.dtype)
    vs = torch.randn(b, hk, 64, d, generator=g, device=q.device, dtype=q.dtype)
    lens = torch.tensor([37, 64], device=q.device)
    ms = (torch.arange(64, device=q.device)[None, :] < lens[:, None]).view(b, 1, 1, 64)
    sc = (qs.float() @ ks.float().transpose(-1, -2)) * scale
    ref = torch.softmax(sc.masked_fill(~ms, float("-inf")), dim=-1) @ vs.float()
    passed = {}
    for name in ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=ms, scale=scale)
                err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 2e-2:
                    raise RuntimeError(f"wrong result on the check case (rel. error {err:.3g})")
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            torch.cuda.synchronize()
            return backend, name.lower(), passed
        except Exception as e:  # RuntimeError "No available kernel", cuDNN's own errors
            passed[name.lower()] = first_line(e)
    raise RuntimeError(f"no SDPA backend runs the masked decode: {passed}")


def sdpa(backend, q, k, v, mask, scale):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


class System:
    """A KV cache and its attention: fill(layer, slot, slots, k, v) writes a new sequence's
    prompt KV from position 0 (not timed); prepare runs once per step inside the graph; attend
    (per layer) appends the new token's k, v and attends; finish checks after the run. n32: the
    int32 metadata entries the system reads."""

    name = ""
    kv_format = "bf16"
    n32 = 0

    def __init__(self, model, geo, meta):
        self.model, self.geo, self.meta, self.device = model, geo, meta, model.device

    def cache_bytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def extra(self):
        return {}

    def finish(self):
        pass


class Fp4attnSystem(System):
    name = "fp4attn-nvfp4"
    kv_format = "nvfp4"

    def __init__(self, model, geo, meta):
        super().__init__(model, geo, meta)
        import fp4attn

        self.fp4attn = fp4attn
        if self.device.type == "cuda" and not fp4attn.cuda_available():
            raise RuntimeError("fp4attn: this build or device cannot run CUDA tensors")
        self.n32 = geo.batch + geo.batch * geo.max_pages
        # Globals supplied (serving should supply them): amax = 8 std of the model's k / v.
        kg, vg = NVFP4_SCALE / (8 * model.k_std), NVFP4_SCALE / (8 * model.v_std)
        self.caches = [
            fp4attn.PagedKVCache.empty(geo.num_pages, PAGE, geo.kv_heads, geo.head_dim,
                                       format="nvfp4", device=self.device, k_global=kg,
                                       v_global=vg)
            for _ in range(geo.layers)
        ]  # fmt: skip
        self.q_shape = (geo.batch, 1, geo.heads, geo.head_dim)
        self.out = torch.zeros(self.q_shape, dtype=torch.bfloat16, device=self.device)
        # One plan for the batch shape, all layers and all steps (capacity: max_pages).
        self.plan = fp4attn.DecodePlan(self.caches[0], self.out, meta.block_tables,
                                       softmax_scale=geo.scale)  # fmt: skip
        self.attention = (
            "fp4attn.append_kv (int64 slots) + DecodePlan.run(out=) over the NVFP4 paged "
            "cache (NHD pages of 16); one plan for all layers and steps"
        )

    def tensors(self):
        for c in self.caches:
            yield from (c.k_data, c.v_data, c.k_scales, c.v_scales)

    def fill(self, layer, s, slots, k, v):
        self.fp4attn.append_kv(self.caches[layer], k, v, slots)

    def prepare(self):
        pass

    def attend(self, layer, q, k, v):
        cache = self.caches[layer]
        self.fp4attn.append_kv(cache, k, v, self.meta.slots)
        self.plan.run(q.view(self.q_shape), cache, self.meta.block_tables, self.meta.seq_lens,
                      out=self.out)  # fmt: skip
        return self.out.view(self.geo.batch, -1)

    def extra(self):
        return {"num_splits": self.plan.num_splits, "k_global": self.caches[0].k_global.item(),
                "v_global": self.caches[0].v_global.item()}  # fmt: skip

    def finish(self):
        for c in self.caches:
            c.check_errors()  # raises ValueError naming what the kernels flagged


class PagedBf16(System):
    """BF16 pages [num_pages, 16, kv_heads, d] per layer for K and V (NHD), tokens written by
    index_copy_ of their slots."""

    name = "bf16-paged"

    def __init__(self, model, geo, meta):
        super().__init__(model, geo, meta)
        shape = (geo.num_pages, PAGE, geo.kv_heads, geo.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=self.device)
                  for _ in range(geo.layers)]  # fmt: skip
        self.v = [torch.zeros_like(t) for t in self.k]

    def tensors(self):
        yield from self.k
        yield from self.v

    def _write(self, layer, slots, k, v):
        flat = (-1, self.geo.kv_heads, self.geo.head_dim)
        self.k[layer].view(flat).index_copy_(0, slots, k)
        self.v[layer].view(flat).index_copy_(0, slots, v)

    def fill(self, layer, s, slots, k, v):
        self._write(layer, slots, k, v)


class FlexPagedSystem(PagedBf16):
    """FlexAttention over the page pool: the pool viewed as one sequence [1, kv_heads,
    num_pages * 16, d], a BlockMask whose KV blocks are pages (kv_indices: the sequence's page
    ids, kv_num_blocks: its page count), and a mask_mod keeping key j iff its page belongs to
    the sequence and its logical position is below the length."""

    def __init__(self, model, geo, meta, compile_flex, split_kv=None):
        super().__init__(model, geo, meta)
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        self.n32 = meta.n32
        b, n, dev = geo.batch, geo.num_pages, self.device
        s = n * PAGE
        self.views = [
            (k.view(1, s, geo.kv_heads, geo.head_dim).permute(0, 2, 1, 3),
             v.view(1, s, geo.kv_heads, geo.head_dim).permute(0, 2, 1, 3))
            for k, v in zip(self.k, self.v)
        ]  # fmt: skip
        # The mask's own tensors (not views into the packed metadata), refreshed by prepare.
        self.lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self.owner = torch.full((n,), -1, dtype=torch.int32, device=dev)
        self.logical = torch.zeros(n, dtype=torch.int32, device=dev)
        self.num_blocks = torch.zeros(b, 1, 1, dtype=torch.int32, device=dev)
        # As wide as the pool, as PagedAttention's converted masks are (CPU flex needs it).
        self.indices = torch.zeros(b, 1, 1, n, dtype=torch.int32, device=dev)
        owner, logical, lens = self.owner, self.logical, self.lens

        def mask_mod(seq, head, q_idx, kv_idx):
            page = kv_idx // PAGE
            return (owner[page] == seq) & (logical[page] * PAGE + kv_idx % PAGE < lens[seq])

        self.block_mask = BlockMask.from_kv_blocks(
            self.num_blocks, self.indices, BLOCK_SIZE=(128, PAGE), mask_mod=mask_mod,
            seq_lengths=(1, s),
        )  # fmt: skip
        self.compiled = compile_flex
        # None: torch's own split count (flex_decoding.get_split_k: 2 * SMs // (b * kv_heads)).
        self.kernel_options = {"SPLIT_KV": split_kv} if split_kv else None
        self.flex = torch.compile(flex_attention, dynamic=False, fullgraph=True) if compile_flex \
            else flex_attention  # fmt: skip
        how = "torch.compile'd FlexAttention (flex-decoding kernel)" if compile_flex else \
            "eager FlexAttention (dense reference path: mask_mod over every slot)"  # fmt: skip
        self.attention = (
            f"{how} over BF16 pages [num_pages, 16, {geo.kv_heads}, {geo.head_dim}] viewed as "
            f"[1, {geo.kv_heads}, num_pages*16, {geo.head_dim}]; BlockMask from the page table "
            "(KV block = page, kv_indices = page ids, kv_num_blocks = pages), mask_mod = page "
            "owner and logical position < length; reads only the sequence's pages"
        )

    def prepare(self):
        m, p = self.meta, self.geo.max_pages
        self.lens.copy_(m.seq_lens)
        self.owner.copy_(m.owner)
        self.logical.copy_(m.logical)
        self.num_blocks.view(-1).copy_((m.seq_lens + (PAGE - 1)) // PAGE)
        self.indices[:, 0, 0, :p].copy_(m.block_tables)

    def attend(self, layer, q, k, v):
        self._write(layer, self.meta.slots, k, v)
        kk, vv = self.views[layer]
        b, h, d = q.shape
        o = self.flex(q.view(b, h, 1, d), kk, vv, block_mask=self.block_mask,
                      scale=self.geo.scale, enable_gqa=True,
                      kernel_options=self.kernel_options)  # fmt: skip
        return o.reshape(b, h * d)

    def extra(self):
        return {"flex_compiled": self.compiled, "flex_kernel_options": self.kernel_options}


class GatherPagedSystem(PagedBf16):
    """The fallback: each layer's pages gathered (block table order) into a contiguous copy
    [b, kv_heads, max_pages * 16, d], attended by SDPA with a length mask."""

    def __init__(self, model, geo, meta):
        super().__init__(model, geo, meta)
        b, dev = geo.batch, self.device
        self.n32 = b + b * geo.max_pages
        self.tables = torch.zeros(b, geo.max_pages, dtype=torch.int64, device=dev)
        # All True until prepare: the SDPA backend probe must not see empty rows.
        self.mask = torch.ones(b, 1, 1, geo.max_len, dtype=torch.bool, device=dev)
        self.arange = torch.arange(geo.max_len, device=dev)
        q = torch.zeros(b, geo.kv_heads, geo.group, geo.head_dim, dtype=torch.bfloat16, device=dev)
        kk, vv = self._gather(0)
        self.backend, self.backend_name, self.passed = pick_sdpa_backend(
            q, kk, vv, self.mask, geo.scale
        )
        self.attention = (
            f"pages gathered per layer into a contiguous [b, {geo.kv_heads}, max_pages*16, "
            f"{geo.head_dim}] copy (reads the pages, writes and reads the copy), then SDPA "
            f"{self.backend_name} with a boolean length mask"
        )

    def _gather(self, layer):
        b, g = self.geo.batch, self.geo
        shape = (b, g.max_len, g.kv_heads, g.head_dim)
        kk = self.k[layer][self.tables].view(shape).transpose(1, 2)
        vv = self.v[layer][self.tables].view(shape).transpose(1, 2)
        return kk, vv

    def prepare(self):
        m = self.meta
        self.tables.copy_(m.block_tables)
        self.mask.view(self.geo.batch, -1).copy_(self.arange[None, :] < m.seq_lens[:, None])

    def attend(self, layer, q, k, v):
        self._write(layer, self.meta.slots, k, v)
        kk, vv = self._gather(layer)
        b, g = self.geo.batch, self.geo
        o = sdpa(self.backend, q.view(b, g.kv_heads, g.group, g.head_dim), kk, vv, self.mask,
                 g.scale)  # fmt: skip
        return o.reshape(b, -1)

    def extra(self):
        return {"sdpa_backend": self.backend_name, "sdpa_backends_passed": self.passed}


class ContiguousSdpaSystem(System):
    """A contiguous BF16 cache [b, kv_heads, max_len, d] per layer (one row per slot), the new
    token written at its position, SDPA with a boolean length mask."""

    name = "sdpa-contiguous"

    def __init__(self, model, geo, meta):
        super().__init__(model, geo, meta)
        b, dev = geo.batch, self.device
        self.n32 = b
        shape = (b, geo.kv_heads, geo.max_len, geo.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _ in range(geo.layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.rows = torch.arange(b, device=dev)
        # All True until prepare: the SDPA backend probe must not see empty rows.
        self.mask = torch.ones(b, 1, 1, geo.max_len, dtype=torch.bool, device=dev)
        self.arange = torch.arange(geo.max_len, device=dev)
        q = torch.zeros(b, geo.kv_heads, geo.group, geo.head_dim, dtype=torch.bfloat16, device=dev)
        self.backend, self.backend_name, self.passed = pick_sdpa_backend(
            q, self.k[0], self.v[0], self.mask, geo.scale
        )
        self.attention = (
            f"torch SDPA ({self.backend_name}) on a contiguous [b, {geo.kv_heads}, max_len, "
            f"{geo.head_dim}] cache, q as [b, {geo.kv_heads}, {geo.group}, {geo.head_dim}] (GQA "
            "group as query rows), boolean length mask [b, 1, 1, max_len]; reads max_len tokens "
            "per sequence"
        )

    def tensors(self):
        yield from self.k
        yield from self.v

    def fill(self, layer, s, slots, k, v):
        n = k.shape[0]  # the row of slot s, from position 0
        self.k[layer][s, :, :n].copy_(k.transpose(0, 1))
        self.v[layer][s, :, :n].copy_(v.transpose(0, 1))

    def prepare(self):
        self.mask.view(self.geo.batch, -1).copy_(self.arange[None, :] < self.meta.seq_lens[:, None])

    def attend(self, layer, q, k, v):
        pos = self.meta.pos
        self.k[layer][self.rows, :, pos] = k
        self.v[layer][self.rows, :, pos] = v
        b, g = self.geo.batch, self.geo
        o = sdpa(self.backend, q.view(b, g.kv_heads, g.group, g.head_dim), self.k[layer],
                 self.v[layer], self.mask, g.scale)  # fmt: skip
        return o.reshape(b, -1)

    def extra(self):
        return {"sdpa_backend": self.backend_name, "sdpa_backends_passed": self.passed}


def make_system(name, variant, model, geo, meta, args):
    if name == "fp4attn-nvfp4":
        return Fp4attnSystem(model, geo, meta)
    if name == "sdpa-contiguous":
        return ContiguousSdpaSystem(model, geo, meta)
    if name == "bf16-paged":
        if variant == "gather":
            return GatherPagedSystem(model, geo, meta)
        compile_flex = model.device.type == "cuda" or args.cpu_compile_flex
        return FlexPagedSystem(model, geo, meta, compile_flex, args.flex_split_kv)
    raise ValueError(f"unknown system {name!r}")


# ---------------------------------------------------------------------------------------------
# One system's loop


def fill_seed(seed, event, layer):
    return ((seed * 1_000_003 + event) * 1009 + layer) % (2**62)


class Loop:
    """A system's generation loop: scheduler, static step tensors, the step (and its graph)."""

    def __init__(self, name, variant, model, geo, args, seed, draw):
        self.model, self.geo, self.seed = model, geo, seed
        dev = model.device
        self.meta = StepMeta(geo, dev)
        self.sched = Scheduler(geo, model.vocab, seed, draw)
        self.system = make_system(name, variant, model, geo, self.meta, args)
        b = geo.batch
        self.last_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.logits = torch.zeros(b, model.vocab, dtype=torch.bfloat16, device=dev)
        self.probes = torch.zeros(2, b, geo.heads * geo.head_dim, dtype=torch.bfloat16, device=dev)
        self.graph = None
        meta, system = self.meta, self.system

        def step():
            ids = torch.where(meta.fresh_mask != 0, meta.fresh_ids, self.last_ids)
            system.prepare()
            logits = model.decode(ids, meta.pos, system.attend, self.probes)
            self.last_ids.copy_(logits.argmax(-1))
            self.logits.copy_(logits)

        self.step = step

    def begin(self, teacher=None):
        """Host scheduling and the prompt fills of new sequences (outside the timed window).
        Returns the number of new sequences."""
        fills = self.sched.begin_step(teacher)
        m, dev = self.model, self.model.device
        shape = (self.geo.kv_heads, self.geo.head_dim)
        for s, n, event, slots in fills:
            slots_t = torch.from_numpy(slots).to(dev)
            for layer in range(self.geo.layers):
                g = torch.Generator(device=dev)
                g.manual_seed(fill_seed(self.seed, event, layer))
                k = torch.randn((n, *shape), generator=g, device=dev, dtype=torch.bfloat16)
                v = torch.randn((n, *shape), generator=g, device=dev, dtype=torch.bfloat16)
                k.mul_(m.k_std)
                v.mul_(m.v_std)
                self.system.fill(layer, s, slots_t, k, v)
        return len(fills)

    def stage(self):
        self.meta.stage(self.sched, self.system.n32)

    def upload(self):
        self.stage()
        self.meta.send()

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()

    def warm_up(self):
        """Eager steps (compiles, cuBLAS/cuDNN plans) on a side stream, as CUDA graph capture
        wants. They write the same KV at the same slots as the step will."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()

    def capture(self):
        """The step in one CUDA graph (after warm_up)."""
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.step()
        torch.cuda.synchronize()
        self.graph = g

    def close(self):
        self.graph = None
        self.system = None
        self.meta = None


def cleanup(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_system(name, variant, model, context, args, guard_tokens):
    """Runs one system at one context: guard steps (teacher-forced, recorded), warm-up steps,
    timed steps. Returns (record, guard data)."""
    dev = model.device
    cuda = dev.type == "cuda"
    geo = geometry(model, args.batch, context, args.gen_hi)
    draw = benchmark_draw(context, args.gen_lo, args.gen_hi)
    t_setup = time.perf_counter()
    loop = system = None
    try:
        loop = Loop(name, variant, model, geo, args, args.seed + context, draw)
        system = loop.system
        rec = {"system": name, "batch": args.batch, "context": context,
               "attention": system.attention, "kv_format": system.kv_format, "page_size": PAGE,
               "max_pages_per_seq": geo.max_pages, "pool_pages": geo.num_pages,
               "kv_cache_bytes": system.cache_bytes()}  # fmt: skip
        log(f"  {name}: {rec['kv_cache_bytes'] / 1e9:.2f} GB of cache, filling prompts")
        loop.begin(teacher=guard_tokens[0])
        loop.upload()
        rec["graph"] = False
        if cuda:
            log(f"  {name}: warm-up" + ("" if args.no_graph else " and CUDA graph capture"))
            t0 = time.perf_counter()
            loop.warm_up()  # a broken step raises here (and the caller tries the fallback)
            rec["warm_up_s"] = time.perf_counter() - t0
            if not args.no_graph:
                t0 = time.perf_counter()
                try:
                    loop.capture()
                    rec["graph"] = True
                except Exception as e:  # run eagerly, say why
                    rec["capture_error"] = first_line(e)
                    log(f"  {name}: capture failed, running eagerly: {rec['capture_error']}")
                    loop.graph = None
                    torch.cuda.synchronize()
                rec["capture_s"] = time.perf_counter() - t0
        rec["setup_s"] = time.perf_counter() - t_setup
        kinds = ["guard"] * len(guard_tokens) + ["warmup"] * args.warmup + ["timed"] * args.steps
        guard = {"logits": [], "probes": []}
        times, starts, stops = [], [], []
        new_seqs, lens = 0, []
        wall0 = None
        for i, kind in enumerate(kinds):
            if kind == "timed" and wall0 is None:
                if cuda:
                    torch.cuda.synchronize()
                wall0 = time.perf_counter()
            if i > 0:
                n = loop.begin(teacher=guard_tokens[i] if kind == "guard" else None)
                if kind == "timed":
                    new_seqs += n
                loop.stage()
            if kind == "timed":
                lens.append(float(loop.sched.seq_lens.mean()))
                if cuda:
                    starts.append(torch.cuda.Event(enable_timing=True))
                    stops.append(torch.cuda.Event(enable_timing=True))
                    starts[-1].record()
                t0 = time.perf_counter()
            if i > 0:
                loop.meta.send()
            loop.run()
            if kind == "timed":
                if cuda:
                    stops[-1].record()
                else:
                    times.append(1e3 * (time.perf_counter() - t0))
            if kind == "guard":
                guard["logits"].append(loop.logits.float().cpu())
                guard["probes"].append(loop.probes.float().cpu())
        if cuda:
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) for a, b in zip(starts, stops)]
        wall = time.perf_counter() - wall0 if wall0 is not None else float("nan")
        total_ms = sum(times)
        rec.update({
            "tokens_per_s": args.batch * len(times) / (total_ms / 1e3) if total_ms else None,
            "step_ms": total_ms / len(times) if times else None,
            "step_ms_median": float(np.median(times)) if times else None,
            "step_ms_min": min(times) if times else None,
            "step_ms_max": max(times) if times else None,
            "tokens_per_s_wall": args.batch * len(times) / wall if times else None,
            "timed_steps": len(times), "warmup_steps": args.warmup,
            "guard_steps": len(guard_tokens), "new_sequences_timed": new_seqs,
            "mean_seq_len_timed": float(np.mean(lens)) if lens else None,
            "logits_finite": bool(torch.isfinite(loop.logits.float()).all().item()),
        })  # fmt: skip
        rec.update(system.extra())
        try:
            system.finish()
        except ValueError as e:  # the device error flag: keep the timings, say what it found
            rec["device_errors"] = first_line(e)
        return rec, guard
    finally:
        if loop is not None:
            loop.close()
        del loop, system
        if name == "bf16-paged":
            torch._dynamo.reset()  # drops the compiled flex and what its guards hold
        cleanup(dev)


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


# ---------------------------------------------------------------------------------------------
# KV memory budget


def page_bytes(fmt, kv, d):
    """Bytes of one page (16 tokens, K and V) of one layer."""
    if fmt == "nvfp4":
        return PAGE * kv * (d // 2 + d // 16) * 2
    return PAGE * kv * d * 2 * 2


def sequences_at_budget(budget, layers, kv, d, context):
    pages = -(-context // PAGE)
    return {
        "fp4attn-nvfp4": budget // (layers * pages * page_bytes("nvfp4", kv, d)),
        "bf16-paged": budget // (layers * pages * page_bytes("bf16", kv, d)),
        # one row of `context` tokens reserved per sequence
        "sdpa-contiguous": budget // (layers * context * kv * d * 2 * 2),
    }


def verify_budget(model, budget, context):
    """Allocates the NVFP4 pools the budget buys (all layers), fills them with random codes,
    and decodes once per layer over as many sequences of `context` as they hold."""
    dev, kv, d, layers = model.device, model.kv_heads, model.head_dim, model.n_layers
    per_layer = budget // layers // page_bytes("nvfp4", kv, d)
    pages_per_seq = -(-context // PAGE)
    n = per_layer // pages_per_seq
    out = {"context": context, "format": "nvfp4", "pages_per_layer": per_layer,
           "sequences": n}  # fmt: skip
    caches = []
    try:
        import fp4attn

        for _ in range(layers):
            c = fp4attn.PagedKVCache.empty(per_layer, PAGE, kv, d, format="nvfp4", device=dev,
                                           k_global=1.0, v_global=1.0)  # fmt: skip
            for t in (c.k_data, c.v_data):
                t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, device=dev))
            for t in (c.k_scales, c.v_scales):
                t.copy_((0.5 + 1.5 * torch.rand(t.shape, device=dev)).to(t.dtype))
            caches.append(c)
        out["bytes_allocated"] = sum(
            t.numel() * t.element_size()
            for c in caches
            for t in (c.k_data, c.v_data, c.k_scales, c.v_scales)
        )
        perm = torch.randperm(per_layer, device=dev)[: n * pages_per_seq]
        tables = perm.view(n, pages_per_seq).to(torch.int32).contiguous()
        lens = torch.full((n,), context, dtype=torch.int32, device=dev)
        q = torch.randn(n, 1, model.heads, d, dtype=torch.bfloat16, device=dev)
        o = torch.empty_like(q)
        plan = fp4attn.DecodePlan(caches[0], q, tables, softmax_scale=d**-0.5)
        finite = True
        t0 = time.perf_counter()
        for c in caches:
            plan.run(q, c, tables, lens, out=o)
            finite = finite and bool(torch.isfinite(o.float()).all().item())
        out["decode_all_layers_s"] = time.perf_counter() - t0
        for c in caches:
            c.check_errors()
        out["decode_ok"] = finite
    except Exception as e:
        out["error"] = first_line(e)
        out["decode_ok"] = False
    finally:
        caches = None
        cleanup(dev)
    return out


# ---------------------------------------------------------------------------------------------
# Self-test: the decode loop against transformers' own forward of the same weights


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


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write (serve.json-style)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true",
                    help="small model (hidden 256, 4/2 heads, d 64, 2 layers, vocab 1000), "
                    "batch 3, context 64, 3 steps, and the self-test")  # fmt: skip
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 8; tiny 2)")
    ap.add_argument("--batch", type=int, default=None, help="slots (default 32; tiny 3)")
    ap.add_argument("--contexts", default=None, help="default 4096,16384 (tiny 64)")
    ap.add_argument("--gen-range", default=None,
                    help="LO:HI new tokens per sequence (default 16:128; tiny 2:6)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 32; tiny 3)")
    ap.add_argument("--warmup", type=int, default=None, help="steps before timing (default 5)")
    ap.add_argument("--guard-steps", type=int, default=3,
                    help="teacher-forced steps compared across systems (>= 1)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--bf16-paged-attention", default="auto", choices=("auto", "flex", "gather"),
                    help="auto: FlexAttention, the gather + SDPA fallback if it fails")
    ap.add_argument("--kv-budget-gb", type=float, default=None,
                    help="KV memory budget, 1e9 bytes (default: the BF16 paged cache of batch "
                    "x the largest context, all layers)")  # fmt: skip
    ap.add_argument("--no-verify-budget", action="store_true")
    ap.add_argument("--self-test", action="store_true",
                    help="also on CUDA: the decode loop against transformers' forward")
    ap.add_argument("--no-graph", action="store_true", help="run the steps eagerly")
    ap.add_argument("--cpu-compile-flex", action="store_true",
                    help="torch.compile FlexAttention on CPU too (slow to compile)")
    ap.add_argument("--flex-split-kv", type=int, default=16,
                    help="FlexAttention's SPLIT_KV kernel option (0: torch's choice). 16: the "
                    "strongest BF16 paged peer measured at batch 32 (torch's choice ran 2.5x "
                    "slower at 16k: 18.3 against 7.2 ms a step on the H200)")
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


if __name__ == "__main__":
    sys.exit(main())
