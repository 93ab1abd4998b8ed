"""The paged KV cache (NVFP4, or FP8 as the comparison point) for decode, speculative decode and
paged prefill: docs/kernels/decode.md has the layout, docs/python.md the usage.

    cache = PagedKVCache.empty(num_pages, page_size, kv_heads, head_dim, format="nvfp4")
    append_kv(cache, k, v, slot_mapping)                 # vLLM's reshape_and_cache
    plan = DecodePlan(cache, q, block_tables)            # once per batch shape (FlashInfer's plan)
    o = plan.run(q, cache, block_tables, seq_lens)       # once per layer; CUDA-graph capturable
    o = decode(q, cache, block_tables, seq_lens)         # the same in one call

CPU tensors run the host reference (append) and the golden paged attention (float64 on the
decoded cache), which check every index on the host; CUDA tensors the GPU append and decode
kernels, which read the indices on the device only (no host copy, no sync): a bad one is skipped
or gives NaN rows and sets a bit of the cache's error flag, read by cache.check_errors(). The
public functions check shapes and dtypes here, then call the torch.library custom ops of _ops
(no autograd). docs/serving.md maps this onto a serving engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _checks, _layout, _ops
from ._native import UnsupportedError, require_cuda_build

FORMATS = ("nvfp4", "fp8")
SCALE_RULES = _layout.NVFP4_SCALE_RULES  # the rules the append takes (quantize.h)
_BLOCK = _layout.PACKED_BLOCK["nvfp4"]  # values per NVFP4 scale
_APPEND_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CODE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_CACHE_DIMS = "(num_pages, page_size, kv_heads, {})"


@dataclass
class PagedKVCache:
    """The K/V cache of one layer, NHD pages (vLLM's reshape_and_cache_flash layout):

    nvfp4: k_data, v_data uint8 [num_pages, page_size, kv_heads, head_dim // 2] (two E2M1 codes
           per byte, element 2j in the low nibble); k_scales, v_scales float8_e4m3fn (or uint8)
           [num_pages, page_size, kv_heads, head_dim // 16]; k_global, v_global float32 [1], the
           encode scale s_enc (x = e2m1 * scale / s_enc).
    fp8:   k_data, v_data float8_e4m3fn (or uint8) [num_pages, page_size, kv_heads, head_dim];
           k_scales, v_scales None; k_global, v_global float32 [1], the decode scale (vLLM's
           k_scale, x = e4m3 * scale).

    A global of 0 is "not calibrated yet": the next append whose written tokens have a nonzero
    finite amax sets it from that append's values (until then the side holds only zeros and
    NaN/Inf, which decode as themselves). `rule` is the NVFP4 block-scale rule of the append
    (quantize.h). The tensors may be views into a larger page pool (any strides, last dimension
    contiguous). `errors` (int32 [1] on the cache's device, optional; empty() makes one): the
    device error flag the CUDA append and decode OR their findings into (check_errors).
    """

    k_data: torch.Tensor
    v_data: torch.Tensor
    k_scales: torch.Tensor | None
    v_scales: torch.Tensor | None
    k_global: torch.Tensor
    v_global: torch.Tensor
    format: str = "nvfp4"
    rule: str = "nearest"
    errors: torch.Tensor | None = None

    @classmethod
    def empty(
        cls,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        format: str = "nvfp4",
        device: torch.device | str = "cpu",
        k_global: float = 0.0,
        v_global: float = 0.0,
        rule: str = "nearest",
    ) -> PagedKVCache:
        """A zeroed cache; k_global/v_global 0 means calibrated by the first append with data."""
        _checks.check_choice(format, "format", FORMATS)
        _checks.check_choice(rule, "rule", SCALE_RULES)
        for value, name in (
            (num_pages, "num_pages"),
            (page_size, "page_size"),
            (kv_heads, "kv_heads"),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name}: expected a value >= 1, got {value}")
        if isinstance(head_dim, bool) or not isinstance(head_dim, int):
            raise TypeError(f"head_dim: expected an int, got {type(head_dim).__name__}")
        _checks.check_head_dim(head_dim, "head_dim")
        if num_pages * page_size >= 2**31:
            raise ValueError(
                f"num_pages: num_pages * page_size = {num_pages * page_size} slots do not fit the "
                "int32 slot mapping"
            )
        # Stored as float32: checked in float32 (an NVFP4 s_enc, or FP8's decode scale).
        scale_range = (
            _checks.NVFP4_ENCODE_SCALE_RANGE
            if format == "nvfp4"
            else _checks.FP8_DECODE_SCALE_RANGE
        )
        for value, name in ((k_global, "k_global"), (v_global, "v_global")):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
            if value != 0:
                _checks.check_float32(
                    value, name, *scale_range, expected="0 (calibrate) or a finite value > 0"
                )
        shape = (num_pages, page_size, kv_heads)
        if format == "nvfp4":
            data = (*shape, head_dim // 2)
            scales = (*shape, head_dim // _BLOCK)
            k_data = torch.zeros(data, dtype=torch.uint8, device=device)
            v_data = torch.zeros(data, dtype=torch.uint8, device=device)
            k_scales = torch.zeros(scales, dtype=torch.float8_e4m3fn, device=device)
            v_scales = torch.zeros(scales, dtype=torch.float8_e4m3fn, device=device)
        else:
            k_data = torch.zeros((*shape, head_dim), dtype=torch.float8_e4m3fn, device=device)
            v_data = torch.zeros((*shape, head_dim), dtype=torch.float8_e4m3fn, device=device)
            k_scales = v_scales = None
        kg = torch.tensor([float(k_global)], dtype=torch.float32, device=device)
        vg = torch.tensor([float(v_global)], dtype=torch.float32, device=device)
        errors = torch.zeros(1, dtype=torch.int32, device=device)
        return cls(k_data, v_data, k_scales, v_scales, kg, vg, format, rule, errors)

    @property
    def num_pages(self) -> int:
        return self.k_data.shape[0]

    @property
    def page_size(self) -> int:
        return self.k_data.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k_data.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k_data.shape[3] * (2 if self.format == "nvfp4" else 1)

    @property
    def device(self) -> torch.device:
        return self.k_data.device

    def check_errors(self) -> None:
        """Raises ValueError listing what the CUDA kernels found since the last check (a slot
        past the cache, a bad length, page id or cu_seqlens_q), and clears the flag. Reads the
        flag from the device: a sync, for a debug step or once in a while, not the hot path."""
        if self.errors is None:
            return
        _check_errors_tensor(self.errors)
        bits = int(self.errors.item())
        if bits == 0:
            return
        self.errors.zero_()
        found = [text for bit, text in sorted(_layout.PAGED_ERRORS.items()) if bits & bit]
        raise ValueError("paged cache: the kernels met bad indices: " + "; ".join(found))

    def _tensors(self) -> tuple:
        """The arguments the _ops paged ops take for the cache: its tensors and format."""
        return (
            self.k_data,
            self.v_data,
            self.k_scales,
            self.v_scales,
            self.k_global,
            self.v_global,
            self.format,
        )

    def dequantize(
        self, block_tables: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached K and V of every sequence as float32 [batch, max(seq_lens), kv_heads,
        head_dim]: the codec values (what decode multiplies), 0 past each sequence's length.
        CPU only."""
        check_cache(self)
        _check_tables(block_tables, seq_lens, self)
        if self.device.type != "cpu":
            raise UnsupportedError(
                "cache: dequantize runs on CPU tensors only; move the cache and tables with .cpu()"
            )
        max_len = max([int(x) for x in seq_lens.tolist()], default=0)
        k, v = _ops.paged_kv_dequantize(
            *self._tensors(), block_tables, seq_lens, max_len, self.head_dim
        )
        return k[:, :max_len], v[:, :max_len]


_CHECKED_FIELDS = ("format", "rule", "k_data", "v_data", "k_scales", "v_scales", "k_global",
                   "v_global", "errors")  # fmt: skip


def check_cache(cache: object) -> PagedKVCache:
    """Types, dtypes, shapes and devices of a PagedKVCache's tensors.

    A cache whose fields are the very objects of its last successful check is not checked again:
    every decode and append of a serving step checks the cache, and a full check costs tens of
    microseconds of host time (what an eager decode step spends). A field assigned anew is checked
    again; a tensor resized in place (resize_, set_) is not seen here but is refused by the C++
    entry points, which check every shape they receive."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache: expected a fp4attn.PagedKVCache, got {type(cache).__name__}")
    fields = tuple(getattr(cache, name) for name in _CHECKED_FIELDS)
    checked = cache.__dict__.get("_checked")
    if checked is not None and all(a is b for a, b in zip(fields, checked)):
        return cache
    _check_cache_fields(cache)
    cache.__dict__["_checked"] = fields
    return cache


def _check_cache_fields(cache: PagedKVCache) -> None:
    _checks.check_choice(cache.format, "cache.format", FORMATS)
    _checks.check_choice(cache.rule, "cache.rule", SCALE_RULES)
    fp4 = cache.format == "nvfp4"
    last = "head_dim // 2" if fp4 else "head_dim"
    for name in ("k_data", "v_data"):
        t = _checks.check_tensor(getattr(cache, name), f"cache.{name}", 4, _CACHE_DIMS.format(last))
        allowed = (torch.uint8,) if fp4 else _CODE_DTYPES
        if t.dtype not in allowed:
            names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
            raise TypeError(f"cache.{name}: expected dtype {names}, got {t.dtype}")
        _checks.check_last_dim_contiguous(t, f"cache.{name}")
    kd = cache.k_data
    if cache.v_data.shape != kd.shape:
        raise ValueError(
            f"cache.v_data: expected shape {tuple(kd.shape)} like cache.k_data, got "
            f"{tuple(cache.v_data.shape)}"
        )
    _checks.check_head_dim(cache.head_dim, "cache.k_data")
    for name in ("k_scales", "v_scales"):
        t = getattr(cache, name)
        if not fp4:
            if t is not None:
                raise ValueError(f"cache.{name}: must be None for an fp8 cache")
            continue
        if t is None:
            raise ValueError(f"cache.{name}: required for an nvfp4 cache")
        _checks.check_tensor(t, f"cache.{name}", 4, _CACHE_DIMS.format(f"head_dim // {_BLOCK}"))
        if t.dtype not in _CODE_DTYPES:
            raise TypeError(f"cache.{name}: expected dtype float8_e4m3fn or uint8, got {t.dtype}")
        want = (*kd.shape[:3], cache.head_dim // _BLOCK)
        if tuple(t.shape) != want:
            raise ValueError(f"cache.{name}: expected shape {want}, got {tuple(t.shape)}")
        _checks.check_last_dim_contiguous(t, f"cache.{name}")
    for name in ("k_global", "v_global"):
        t = _checks.check_tensor(getattr(cache, name), f"cache.{name}", 1, "(1)")
        if t.dtype != torch.float32 or t.shape[0] != 1:
            raise ValueError(
                f"cache.{name}: expected float32 of shape (1), got {t.dtype} {tuple(t.shape)}"
            )
    if cache.errors is not None:
        _check_errors_tensor(cache.errors)
    for name in ("v_data", "k_scales", "v_scales", "k_global", "v_global", "errors"):
        t = getattr(cache, name)
        if t is not None:
            _checks.check_device(t, f"cache.{name}", kd, "cache.k_data")


def _check_errors_tensor(t: object) -> None:
    _checks.check_tensor(t, "cache.errors", 1, "(1)")
    if t.dtype != torch.int32 or t.shape[0] != 1:
        raise ValueError(
            f"cache.errors: expected int32 of shape (1), got {t.dtype} {tuple(t.shape)}"
        )


def _check_int32(t: object, name: str, rank: int, dims: str) -> torch.Tensor:
    _checks.check_tensor(t, name, rank, dims)
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected int32, got {t.dtype}")
    return t


def _check_tables(block_tables: object, seq_lens: object, cache: PagedKVCache) -> int:
    """block_tables int32 [batch, max_pages], seq_lens int32 [batch] on the cache's device
    (seq_lens None: block_tables alone, as a plan sees them)."""
    _check_int32(block_tables, "block_tables", 2, "(batch, max_pages)")
    _checks.check_device(block_tables, "block_tables", cache.k_data, "the cache")
    if seq_lens is None:
        return block_tables.shape[0]
    _check_int32(seq_lens, "seq_lens", 1, "(batch)")
    _checks.check_device(seq_lens, "seq_lens", cache.k_data, "the cache")
    if seq_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(
            f"seq_lens: {seq_lens.shape[0]} sequences, but block_tables has "
            f"{block_tables.shape[0]} rows"
        )
    return block_tables.shape[0]


def append_kv(
    cache: PagedKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Writes new tokens into the cache in place (vLLM's reshape_and_cache).

    k, v [num_tokens, kv_heads, head_dim]: CPU float16/bfloat16/float32, CUDA float16/bfloat16.
    slot_mapping int32 or int64 [num_tokens] (vLLM's int64 is read as is, never narrowed): token
    t goes to slot page * page_size + offset; a negative slot skips the token (padding: vLLM pads
    graph-captured batches with -1). A slot past the cache, or written twice in one call, is an
    error: raised on CPU; on CUDA (no host copy, no sync) the token is skipped and the cache's
    error flag records a slot past the cache (check_errors), and a slot written twice holds one
    of its tokens. An uncalibrated global (0) is first set from the tokens this call writes,
    unless their finite amax is 0 (all zeros, or only NaN/Inf): then it stays 0.
    """
    check_cache(cache)
    dims = "(num_tokens, kv_heads, head_dim)"
    _checks.check_tensor(k, "k", 3, dims)
    _checks.check_tensor(v, "v", 3, dims)
    _checks.check_tensor(slot_mapping, "slot_mapping", 1, "(num_tokens)")
    cuda = k.device.type == "cuda"
    for t, name in ((k, "k"), (v, "v"), (slot_mapping, "slot_mapping")):
        _checks.check_device(t, name, cache.k_data, "the cache")
    allowed = _checks.CUDA_DTYPES if cuda else _APPEND_CPU_DTYPES
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            where = "CUDA" if cuda else "CPU"
            raise TypeError(
                f"{name}: dtype {t.dtype} is not supported on {where} (supported: {names})"
            )
        _checks.check_last_dim_contiguous(t, name)
    if v.dtype != k.dtype:
        raise TypeError(f"v: dtype {v.dtype} differs from k's {k.dtype}")
    want = (k.shape[0], cache.kv_heads, cache.head_dim)
    if tuple(k.shape) != want:
        raise ValueError(f"k: expected shape {want} {dims} for this cache, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)} like k, got {tuple(v.shape)}")
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping: {slot_mapping.shape[0]} slots for {k.shape[0]} tokens in k"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping: expected int32 (or int64), got {slot_mapping.dtype}")
    _checks.check_last_dim_contiguous(slot_mapping, "slot_mapping")
    if k.device.type not in ("cpu", "cuda"):
        raise ValueError(f"k: device {k.device} is not supported (cpu or cuda)")
    _ops.paged_kv_append(k, v, slot_mapping, *cache._tensors(), cache.rule, cache.errors)


def _check_query(q, cache, block_tables, seq_lens, softmax_scale, causal, cu_seqlens_q):
    """The shape, dtype and device checks of a decode call (seq_lens None: all but the lengths,
    as a plan checks them); returns the softmax scale."""
    check_cache(cache)
    varlen = cu_seqlens_q is not None
    if varlen:
        _checks.check_tensor(q, "q", 3, "(total_q, heads, head_dim)")
    else:
        if isinstance(q, torch.Tensor) and q.dim() == 3:
            raise ValueError(
                "q: rank 3 (total_q, heads, head_dim) needs cu_seqlens_q; pass q as "
                "(batch, s_q, heads, head_dim) otherwise"
            )
        _checks.check_tensor(q, "q", 4, "(batch, s_q, heads, head_dim)")
    _checks.check_device(q, "q", cache.k_data, "the cache")
    scale = _checks.check_softmax_scale(softmax_scale)
    _checks.check_bool(causal, "causal")
    batch = _check_tables(block_tables, seq_lens, cache)
    if varlen:
        _check_int32(cu_seqlens_q, "cu_seqlens_q", 1, "(batch + 1)")
        _checks.check_device(cu_seqlens_q, "cu_seqlens_q", cache.k_data, "the cache")
        if cu_seqlens_q.shape[0] != batch + 1:
            raise ValueError(
                f"cu_seqlens_q: expected batch + 1 = {batch + 1} offsets (block_tables has "
                f"{batch} rows), got {cu_seqlens_q.shape[0]}"
            )
    elif q.shape[0] != batch:
        raise ValueError(f"q: batch {q.shape[0]}, but block_tables has {batch} rows")
    heads, d = q.shape[-2], q.shape[-1]
    if d != cache.head_dim:
        raise ValueError(f"q: head_dim {d} differs from the cache's {cache.head_dim}")
    if heads % cache.kv_heads != 0:
        raise ValueError(
            f"q: number of heads {heads} is not a multiple of the cache's kv heads {cache.kv_heads}"
        )
    _checks.check_last_dim_contiguous(q, "q")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q: device {q.device} is not supported (cpu or cuda)")
    if q.device.type == "cuda":
        require_cuda_build("decode")
        if q.dtype != torch.bfloat16:
            raise TypeError(
                f"q: dtype {q.dtype} is not supported on CUDA (the decode kernel takes bfloat16)"
            )
    elif q.dtype not in _checks.CPU_DTYPES:
        names = ", ".join(str(t).removeprefix("torch.") for t in _checks.CPU_DTYPES)
        raise TypeError(f"q: dtype {q.dtype} is not supported on CPU (supported: {names})")
    return scale


def _check_no_grad(q: torch.Tensor) -> None:
    """decode has no backward (its ops have no autograd formula): a q that asks for a gradient is
    refused, as the rest of the API refuses what autograd cannot do, rather than detached."""
    if torch.is_grad_enabled() and q.requires_grad:
        raise UnsupportedError(
            "q: requires grad, but decode has no backward; call it under torch.no_grad() or "
            "torch.inference_mode(), or pass q.detach()"
        )


def _geometry(cache: PagedKVCache) -> tuple:
    return (cache.format, cache.page_size, cache.kv_heads, cache.head_dim, cache.device)


class DecodePlan:
    """The launch plan of paged decode for one batch shape (FlashInfer's plan/run): made once per
    batch step, or once per captured CUDA graph, and run once per layer.

        plan = DecodePlan(cache, q, block_tables)      # q, block_tables: the shapes of the calls
        o = plan.run(q, cache, block_tables, seq_lens)  # any layer's cache of that geometry

    The plan fixes the calls' shapes (q, block_tables, cu_seqlens_q, the cache's format, page size,
    kv heads, head dim), causal and softmax_scale, and picks the split-KV count for the longest
    sequence it may see, max_seq_len (default block_tables.shape[1] * page_size). It owns the
    split workspace, zeroed once here. The kernel splits each sequence by its own length on the
    device, so one plan serves every page table and every length up to max_seq_len: run does no
    host copy, sync or allocation (with out=), and a run captured in a CUDA graph replays with new
    block_tables / seq_lens / cu_seqlens_q contents. Bad values are never read out of bounds: on
    CUDA they give NaN rows and set the cache's error flag (cache.check_errors()); check_indices()
    checks them on the host before a run, when the caller wants it. One run in flight per plan
    (the workspace): use one plan per stream. num_splits forces the split count (1: no split).
    """

    def __init__(
        self,
        cache: PagedKVCache,
        q: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor | None = None,
        causal: bool = True,
        softmax_scale: float | None = None,
        max_seq_len: int | None = None,
        num_splits: int | None = None,
    ):
        # The checks of a run but the lengths, which the plan does not see.
        self.softmax_scale = _check_query(
            q, cache, block_tables, None, softmax_scale, causal, cu_seqlens_q
        )
        batch = block_tables.shape[0]
        self._scale_arg = softmax_scale  # as given, for the run's checks
        self.causal = causal
        self.varlen = cu_seqlens_q is not None
        self.q_shape = tuple(q.shape)
        self.block_tables_shape = tuple(block_tables.shape)
        self.geometry = _geometry(cache)
        capacity = block_tables.shape[1] * cache.page_size
        if max_seq_len is None:
            max_seq_len = capacity
        for value, name in ((max_seq_len, "max_seq_len"), (num_splits, "num_splits")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if not 0 <= max_seq_len <= capacity:
            raise ValueError(
                f"max_seq_len: expected a value in [0, block_tables.shape[1] * page_size = "
                f"{capacity}], got {max_seq_len}"
            )
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits: expected a value >= 1, got {num_splits}")
        self.max_seq_len = max_seq_len
        self.num_splits = 1
        self.workspace = None
        if q.device.type == "cuda":
            heads = q.shape[-2]
            total_q = q.shape[0] if self.varlen else q.shape[0] * q.shape[1]
            max_s_q = -1 if self.varlen else q.shape[1]
            # The schedule of the capacity: a run's own max_len is block_tables' width, so the
            # split count here must be the one it would pick for max_seq_len.
            n, _, ws = _ops.paged_decode_schedule(
                batch, total_q, heads, cache.kv_heads, cache.head_dim, cache.format == "nvfp4",
                max_s_q, max(max_seq_len, 1), num_splits or 0,
            )  # fmt: skip
            self.num_splits = n
            if ws:
                self.workspace = torch.zeros(ws, dtype=torch.uint8, device=q.device)

    def _check_run(self, q, cache, block_tables, cu_seqlens_q) -> None:
        if tuple(q.shape) != self.q_shape:
            raise ValueError(f"q: shape {tuple(q.shape)} differs from the plan's {self.q_shape}")
        if tuple(block_tables.shape) != self.block_tables_shape:
            raise ValueError(
                f"block_tables: shape {tuple(block_tables.shape)} differs from the plan's "
                f"{self.block_tables_shape}"
            )
        if (cu_seqlens_q is not None) != self.varlen:
            raise ValueError(
                "cu_seqlens_q: the plan was made "
                + ("with" if self.varlen else "without")
                + " cu_seqlens_q"
            )
        if _geometry(cache) != self.geometry:
            raise ValueError(
                f"cache: (format, page_size, kv_heads, head_dim, device) {_geometry(cache)} "
                f"differs from the plan's {self.geometry}"
            )

    def run(
        self,
        q: torch.Tensor,
        cache: PagedKVCache,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        cu_seqlens_q: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
    ):
        """decode() on the plan's shapes: o (and lse with return_lse); out/lse: the caller's
        output tensors (o like q, lse float32 [batch, heads, s_q] or [heads, total_q]), written in
        place and returned, so that the call allocates nothing."""
        _checks.check_bool(return_lse, "return_lse")
        _check_query(q, cache, block_tables, seq_lens, self._scale_arg, self.causal, cu_seqlens_q)
        self._check_run(q, cache, block_tables, cu_seqlens_q)
        return self._launch(q, cache, block_tables, seq_lens, cu_seqlens_q, out, lse, return_lse)

    def _launch(self, q, cache, block_tables, seq_lens, cu_seqlens_q, out, lse, return_lse):
        """run after its argument checks (decode() made the plan from these very arguments)."""
        _check_no_grad(q)
        args = (q, cu_seqlens_q, *cache._tensors(), block_tables, seq_lens, self.softmax_scale,
                self.causal)  # fmt: skip
        tail = (self.workspace, self.num_splits, cache.errors)
        if out is None and lse is None:
            o, l_out = _ops.paged_decode(*args, return_lse, *tail)
            return (o, l_out) if return_lse else o
        o = _check_output(out, q, "out") if out is not None else torch.empty_like(q)
        if lse is not None:
            heads = q.shape[-2]
            want = (heads, q.shape[0]) if self.varlen else (q.shape[0], heads, q.shape[1])
            _check_output(lse, q, "lse", torch.float32, want)
        elif return_lse:
            raise ValueError("lse: return_lse with out= needs the lse tensor too")
        _ops.paged_decode_into(*args, o, lse, *tail)
        return (o, lse) if lse is not None else o

    def check_indices(
        self,
        q: torch.Tensor,
        cache: PagedKVCache,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        cu_seqlens_q: torch.Tensor | None = None,
    ) -> None:
        """Checks page ids, lengths and cu_seqlens_q of a run's arguments on the host (copies the
        indices: a sync), raising ValueError naming the first bad entry, as the CPU path does on
        every call."""
        _check_query(q, cache, block_tables, seq_lens, self._scale_arg, self.causal, cu_seqlens_q)
        self._check_run(q, cache, block_tables, cu_seqlens_q)
        _ops.paged_check_indices(q, cu_seqlens_q, cache._tensors(), block_tables, seq_lens)


def _check_output(t, q, name, dtype=None, shape=None):
    """A caller's output tensor: q's device, the dtype and shape given (q's by default)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dtype = q.dtype if dtype is None else dtype
    shape = tuple(q.shape) if shape is None else tuple(shape)
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise ValueError(
            f"{name}: expected {str(dtype).removeprefix('torch.')} of shape {shape}, got "
            f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
        )
    _checks.check_device(t, name, q, "q")
    _checks.check_last_dim_contiguous(t, name)
    return t


def decode(
    q: torch.Tensor,
    cache: PagedKVCache,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = True,
    cu_seqlens_q: torch.Tensor | None = None,
    return_lse: bool = False,
):
    """Attention of new queries over the paged cache (decode, speculative decode, prefill/extend).

    q [batch, s_q, heads, head_dim] (every sequence has s_q queries), or [total_q, heads,
    head_dim] with cu_seqlens_q int32 [batch + 1] (FlashAttention's cu_seqlens, FlashInfer's
    qo_indptr); CPU float16/bfloat16/float32/float64. block_tables int32 [batch, max_pages] (page
    ids in order; entries past a sequence's last page are not read), seq_lens int32 [batch]
    (cached tokens, the queries' own K/V included: append them first). heads % kv_heads == 0.
    causal is bottom-right aligned: query i of s_q sees key j iff j <= i + seq_len - s_q.
    Returns o like q, and with return_lse also lse float32 (natural log), [batch, heads, s_q]
    or [heads, total_q] for varlen; a query without visible keys gets o = 0, lse = +inf.

    CPU: the golden paged attention (float64 over the decoded cache), which raises on a bad page
    id, length or cu_seqlens_q. CUDA: the decode kernel (docs/kernels/decode.md), bfloat16 q and
    o, through a DecodePlan made for this call: no host copy or sync, so a bad index gives NaN
    rows and sets the cache's error flag (cache.check_errors()). An engine that calls decode per
    layer makes the DecodePlan once per step instead (and can capture run in a CUDA graph).
    No autograd: a q that requires grad raises UnsupportedError unless grad mode is off
    (torch.no_grad(), torch.inference_mode()).
    """
    # The plan checks every argument but seq_lens (and return_lse): check those, not all again.
    plan = DecodePlan(cache, q, block_tables, cu_seqlens_q, causal, softmax_scale)
    _checks.check_bool(return_lse, "return_lse")
    _check_tables(block_tables, seq_lens, cache)
    return plan._launch(q, cache, block_tables, seq_lens, cu_seqlens_q, None, None, return_lse)
