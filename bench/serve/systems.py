"""The systems: how each one stores and attends the KV cache (fp4attn's NVFP4 paged cache, BF16
pages attended by FlexAttention or gathered for SDPA, a contiguous BF16 cache with SDPA), and
the SDPA backend each SDPA path uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import PAGE, first_line

SYSTEMS = ("sdpa-contiguous", "fp4attn-nvfp4", "bf16-paged")  # the reference runs first
NVFP4_SCALE = 2688.0  # 448 * 6: s_enc = 2688 / amax (docs/kernels/decode.md)


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
