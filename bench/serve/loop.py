"""One system's generation loop: the prompt fills, the step (eager or one CUDA graph), and
run_system, which runs guard, warm-up and timed steps at one context and times them."""

from __future__ import annotations

import time

import numpy as np
import torch

from .common import PAGE, cleanup, first_line, log
from .scheduler import Scheduler, StepMeta, benchmark_draw, geometry
from .systems import make_system


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
