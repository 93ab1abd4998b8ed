"""Scheduling for continuous batching: the cache geometry, how a new sequence's prompt and
length are drawn, the host scheduler (slots, pages from a shuffled free list, the step's
metadata) and the static device tensors the step reads (StepMeta, staged in pinned memory)."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import torch

from .common import PAGE


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
