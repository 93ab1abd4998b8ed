"""Context parallelism: one sequence split across the processes of a torch.distributed group.

Every rank passes its own shard of q, k, v (cut by `shard`) and gets its shard of the output:

* `ulysses_attn_func`: all-to-all over heads. Each rank gets every token for h / world heads,
  runs single-process attention on them and sends the outputs back. The result is bit for bit
  the single-process one (heads never interact).
* `ring_attn_func`: K/V travel around the ring; each rank merges the partial outputs of its
  queries with their LSE. K/V are quantized once, to the recipe's kernel operands, before they
  travel, with the whole sequence's statistics (so they are the single-process operands' bytes);
  the messages are those bytes. Causal rings want zig-zag shards (`zigzag=True`) so ranks do
  equal work.

Shards are cut at the 128-token scale tiles of the operands (`shard_ranges`). docs/distributed.md
has the layouts, the exactness of each strategy and the message sizes.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from . import _checks, _defaults, _layout, _ops
from ._native import UnsupportedError
from .api import attn_func

TILE = _layout.SCALE_TILE  # tokens per Q/K scale tile: shards start on a tile
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# NVLink multicast (NVLS) must stay off on the lent machines (device docs). NCCL and NVSHMEM read
# these when a communicator is created, so they are set as soon as this module is imported.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST_ENV)


def init_process_group(*args, **kwargs) -> None:
    """torch.distributed.init_process_group with NVLink multicast off (NO_MULTICAST_ENV)."""
    os.environ.update(NO_MULTICAST_ENV)
    dist.init_process_group(*args, **kwargs)


# ---- sharding ---------------------------------------------------------------------------------


def shard_ranges(seqlen: int, world_size: int, zigzag: bool = False) -> list[list[tuple]]:
    """The token ranges [start, end) of each rank's shard, in the order the shard holds them.

    The sequence is cut into world_size chunks (2 * world_size for zig-zag, rank r taking chunks
    r and 2 * world_size - 1 - r, so causal work is balanced) on 128-token tile boundaries; chunk
    sizes differ by at most one tile, the sequence's last (partial) tile stays in the last chunk,
    and chunks may be empty when the sequence has fewer tiles than chunks.
    """
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    if seqlen < 0:
        raise ValueError(f"seqlen: expected >= 0, got {seqlen}")
    chunks = world_size * (2 if zigzag else 1)
    tiles = -(-seqlen // TILE)
    bounds = [min(seqlen, c * tiles // chunks * TILE) for c in range(chunks)] + [seqlen]
    parts = [(bounds[c], bounds[c + 1]) for c in range(chunks)]
    if not zigzag:
        return [[p] for p in parts]
    return [[parts[r], parts[chunks - 1 - r]] for r in range(world_size)]


def _seq_index(ranges: list[tuple[int, int]], device) -> torch.Tensor:
    return torch.cat([torch.arange(a, e, device=device) for a, e in ranges])


def shard(x: torch.Tensor, group=None, zigzag: bool = False, seq_dim: int = 1) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor (dimension seq_dim: 1 for BSHD, 2 for BHSD)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ranges = shard_ranges(x.shape[seq_dim], world, zigzag)[rank]
    return x.index_select(seq_dim, _seq_index(ranges, x.device))


def unshard(x: torch.Tensor, group=None, zigzag: bool = False, seq_dim: int = 1) -> torch.Tensor:
    """The full-sequence tensor from every rank's shard (a collective: every rank gets it)."""
    world = dist.get_world_size(group)
    lens = _all_gather_ints([x.shape[seq_dim]], group, x.device)[:, 0].tolist()
    longest = max(lens)
    pad = list(x.shape)
    pad[seq_dim] = longest - x.shape[seq_dim]
    padded = torch.cat([x, x.new_zeros(pad)], seq_dim).contiguous()  # all_gather wants equal sizes
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    full_shape = list(x.shape)
    full_shape[seq_dim] = sum(lens)
    full = x.new_empty(full_shape)
    for r, ranges in enumerate(shard_ranges(sum(lens), world, zigzag)):
        mine = parts[r].narrow(seq_dim, 0, lens[r])
        full.index_copy_(seq_dim, _seq_index(ranges, x.device), mine)
    return full


# ---- agreement: every rank checks, every rank raises ------------------------------------------


def _comm_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_ints(values: list[int], group, device) -> torch.Tensor:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts).cpu()


def _require_group(group) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "group: torch.distributed is not initialized; call "
            "fp4attn.distributed.init_process_group (or torch.distributed's) first"
        )


def _agree(group, local_checks) -> tuple[list[int], torch.Tensor]:
    """Runs this rank's checks, then exchanges (ok, signature) with every rank.

    A rank that raised alone would leave the others waiting in the next collective until the
    timeout; here a bad argument anywhere raises on every rank. Returns the signatures [world, n].
    """
    error = None
    try:
        signature = local_checks()
    except (TypeError, ValueError) as e:
        error, signature = e, None
    n = 11
    values = [0] * (n + 1) if error else [1, *signature]
    table = _all_gather_ints(values, group, _comm_device(group))
    if error is not None:
        raise error
    bad = [r for r in range(table.shape[0]) if table[r, 0] == 0]
    if bad:
        raise ValueError(f"group: invalid arguments on rank(s) {bad} (their error says which)")
    table = table[:, 1:]
    if not bool((table[:, 1:] == table[0, 1:]).all()):
        raise ValueError(
            "group: ranks disagree on (batch, heads, kv_heads, head_dim, dtype, recipe, causal, "
            f"zigzag, layout, softmax_scale): {table[:, 1:].tolist()}"
        )
    return signature, table


def _local_checks(q, k, v, softmax_scale, causal, recipe, layout, zigzag):
    def run():
        _checks.check_layout(layout)
        _checks.check_qkv(q, k, v, layout)
        # No backward: refused (on every rank, through _agree) rather than detached.
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise UnsupportedError(
                "q/k/v: require grad, but the context-parallel functions have no backward; call "
                "them under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
            )
        scale = _checks.check_softmax_scale(softmax_scale)
        _checks.check_bool(causal, "causal")
        _checks.check_bool(zigzag, "zigzag")
        _check_ring_recipe(recipe)
        seq = 1 if layout == "bshd" else 2
        if k.shape[seq] != q.shape[seq]:
            raise ValueError(
                f"k: local seqlen {k.shape[seq]} differs from q's {q.shape[seq]} (context "
                "parallelism here is self-attention: q, k, v are shards of one sequence)"
            )
        qb, kb = _layout.to_bshd(q, layout), _layout.to_bshd(k, layout)
        return [
            qb.shape[1],
            qb.shape[0],
            qb.shape[2],
            kb.shape[2],
            qb.shape[3],
            _DTYPES.index(q.dtype),
            _layout.RECIPES.index(recipe),
            int(causal),
            int(zigzag),
            _checks.LAYOUTS.index(layout),
            int(scale * 2**40),  # the scale's value, to catch ranks that disagree
        ]

    return run


def _check_sharding(lens: list[int], zigzag: bool) -> list[list[tuple[int, int]]]:
    ranges = shard_ranges(sum(lens), len(lens), zigzag)
    expected = [sum(e - a for a, e in r) for r in ranges]
    if lens != expected:
        raise ValueError(
            f"q: local seqlens {lens} are not the 128-token-tile sharding of a {sum(lens)}-token "
            f"sequence (expected {expected}, zigzag={zigzag}); cut the inputs with "
            "fp4attn.distributed.shard"
        )
    return ranges


def _new_stats(stats: dict | None) -> dict:
    if stats is None:
        stats = {}
    stats.update(messages=0, bytes_sent=0, bf16_bytes=0, k_bytes=0, v_bytes=0)
    return stats


# ---- all-to-all of byte messages --------------------------------------------------------------


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _all_to_all(send, recv_specs, group, device, stats):
    """send[j]: tensors for rank j; recv_specs[i]: (shape, dtype) of what rank i sends here.
    One uint8 message per pair of ranks, whatever the dtypes."""
    rank = dist.get_rank(group)
    out = [[_as_bytes(t) for t in ts] for ts in send]
    in_sizes = [
        sum(math.prod(s) * torch.empty((), dtype=d).element_size() for s, d in specs)
        for specs in recv_specs
    ]
    buf = torch.empty(sum(in_sizes), dtype=torch.uint8, device=device)
    flat = torch.cat([b for ts in out for b in ts]) if out else buf.new_empty(0)
    dist.all_to_all_single(
        buf,
        flat.to(device),
        output_split_sizes=in_sizes,
        input_split_sizes=[sum(b.numel() for b in ts) for ts in out],
        group=group,
    )
    for j, ts in enumerate(out):
        if j != rank:
            stats["messages"] += 1
            stats["bytes_sent"] += sum(b.numel() for b in ts)
    received = []
    for part, specs in zip(buf.split(in_sizes), recv_specs):
        tensors, at = [], 0
        for shape, dtype in specs:
            n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            tensors.append(part[at : at + n].view(dtype).reshape(shape))
            at += n
        received.append(tensors)
    return received


# ---- Ulysses: all-to-all over heads -----------------------------------------------------------


def _kv_heads_of(rank: int, heads_per_rank: int, group_size: int) -> list[int]:
    """The kv heads rank `rank` needs for its query heads, in an order where its local query
    head i reads local kv head i // (local ratio): kv heads are split between ranks when each
    rank's query heads cover whole GQA groups, and replicated otherwise."""
    first = rank * heads_per_rank
    reads = [(first + i) // group_size for i in range(heads_per_rank)]
    need = sorted(set(reads))
    if heads_per_rank % len(need) == 0:
        ratio = heads_per_rank // len(need)
        if all(need[i // ratio] == reads[i] for i in range(heads_per_rank)):
            return need
    return reads  # one kv head per query head (a group straddles ranks unevenly)


def ulysses_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    recipe: str | None = None,
    return_lse: bool = False,
    layout: str = "bshd",
    group=None,
    zigzag: bool = False,
    stats: dict | None = None,
):
    """Attention of a sequence sharded across `group`, all-to-all over heads (Ulysses style).

    q, k, v: this rank's shard (attn_func's layouts and dtypes), cut by `shard` with the same
    `zigzag`. heads must divide by the world size; kv heads are split when every rank's query
    heads cover whole GQA groups and replicated otherwise (MQA: every rank gets the kv head).
    Returns this rank's shard of o (and lse [b, h, s_local]): bit for bit the shard of
    attn_func on the whole sequence. `stats` (a dict), when given, receives the messages and
    bytes this rank sent (inputs travel in their dtype).
    """
    _require_group(group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    recipe = _defaults.get_default_recipe() if recipe is None else recipe  # checked collectively
    base = _local_checks(q, k, v, softmax_scale, causal, recipe, layout, zigzag)

    def checks():
        sig = base()
        _checks.check_bool(return_lse, "return_lse")
        if sig[2] % world != 0:
            raise ValueError(
                f"q: {sig[2]} heads do not split over {world} ranks (Ulysses gives each rank "
                "heads / world heads); use ring_attn_func"
            )
        return sig

    _, table = _agree(group, checks)
    ranges = _check_sharding(table[:, 0].tolist(), zigzag)
    stats = _new_stats(stats)
    qb, kb, vb = (_layout.to_bshd(t, layout) for t in (q, k, v))
    b, s_l, h, d = qb.shape
    h_kv, hq = kb.shape[2], h // world
    group_size = h // h_kv
    kv_of = [_kv_heads_of(j, hq, group_size) for j in range(world)]
    lens = table[:, 0].tolist()
    dev = qb.device

    def heads(t, idx):
        return t.index_select(2, torch.tensor(idx, device=dev))

    send = [
        [qb[:, :, j * hq : (j + 1) * hq], heads(kb, kv_of[j]), heads(vb, kv_of[j])]
        for j in range(world)
    ]
    nkv = len(kv_of[rank])
    specs = [
        [((b, n, hq, d), q.dtype), ((b, n, nkv, d), q.dtype), ((b, n, nkv, d), q.dtype)]
        for n in lens
    ]
    parts = _all_to_all(send, specs, group, dev, stats)

    # The whole sequence for this rank's heads: each sender's tokens go back to their place.
    S = sum(lens)
    index = [_seq_index(r, dev) for r in ranges]
    full = []
    for t in range(3):
        x = qb.new_empty((b, S, hq if t == 0 else nkv, d))
        for i in range(world):
            x.index_copy_(1, index[i], parts[i][t])
        full.append(x)
    o, lse = attn_func(*full, softmax_scale, causal, recipe, return_lse=True)

    back = [[o.index_select(1, index[i]), lse.index_select(2, index[i])] for i in range(world)]
    specs = [[((b, s_l, hq, d), o.dtype), ((b, hq, s_l), torch.float32)] for _ in range(world)]
    parts = _all_to_all(back, specs, group, dev, stats)
    o = torch.cat([p[0] for p in parts], 2)
    lse = torch.cat([p[1] for p in parts], 1)
    return _layout.result(o, lse, layout, return_lse)


# ---- ring: quantized K/V circulate, partials merge by LSE -------------------------------------


def global_amax(x: torch.Tensor, group=None) -> torch.Tensor:
    """max |x| over the tokens of every rank's BSHD shard, per (batch, head, channel), float32
    [b, h, d]; NaN when any rank has a NaN there (a MAX reduction need not propagate NaN)."""
    b, _, h, d = x.shape
    a = x.abs().amax(1).float() if x.shape[1] else x.new_zeros((b, h, d), dtype=torch.float32)
    nan = torch.isnan(a)
    both = torch.stack([torch.where(nan, torch.inf, a), nan.float()])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    return torch.where(both[1] > 0, torch.nan, both[0])


def _quantize_shard(x: torch.Tensor, amax: torch.Tensor, recipe: str, role: str):
    """quantize_shard, plus the scale of the operand of shard + amax tile (at least one tile even
    for an empty shard): for NVFP4 / MXFP4 Q/K every tile of it is the slice's global factor."""
    b, s, h, d = x.shape
    padded = -(-s // TILE) * TILE
    ext = x.new_zeros((b, padded + TILE, h, d))
    ext[:, :s] = x
    ext[:, padded] = amax.to(x.dtype)  # exact: it is one of x's values (or NaN)
    data, scale = _ops.quantize_operand(ext, recipe, role, 0.0)
    if role == "v":
        pitch = _layout.operand_shapes((b, s, h, d), "v")[0][3]
        return data[..., :pitch].contiguous(), scale, scale
    return data[:, :, :s].contiguous(), scale[:, :, : -(-s // TILE)].contiguous(), scale


def quantize_shard(x: torch.Tensor, amax: torch.Tensor, recipe: str, role: str):
    """The kernel operand (data, scale) of a BSHD shard whose chunks start on 128-token tiles
    (all but the sequence's last tile whole): byte for byte that shard's slice of the operand of
    the whole sequence.

    The quantizers take per-(sequence, head) and per-channel statistics from every token (NVFP4
    tensor scales, MXFP4 head exponents, V's channel scales); a zero-padded tile whose first
    token holds the whole sequence's amax (`global_amax`) makes them the global ones, while
    tile-local scales never see it. The op then runs once on shard + tile.
    """
    data, scale, _ = _quantize_shard(x, amax, recipe, role)
    return data, scale


def merge_partials(o, lse, o_part, lse_part):
    """Merges two attention results over disjoint key sets, in float32, in place into (o, lse):
    o [b, s, h, d], lse [b, h, s] (natural log; -inf: no key yet). An empty partial (LSE +inf,
    attn_func's convention for a row without keys) has weight 0; no NaN unless an input has one."""
    lse_part = torch.where(lse_part == torch.inf, -torch.inf, lse_part.float())
    m = torch.maximum(lse, lse_part)
    m = torch.where(m == -torch.inf, 0.0, m)  # two empty sides: weights 0, not exp(nan)
    wa, wb = torch.exp(lse - m), torch.exp(lse_part - m)
    total = wa + wb
    inv = torch.where(total > 0, 1 / total, 0.0)
    ca, cb = (wa * inv).transpose(1, 2).unsqueeze(-1), (wb * inv).transpose(1, 2).unsqueeze(-1)
    o.copy_(o * ca + o_part.float() * cb)
    lse.copy_(m + torch.log(total))


# ---- the ring's messages: packed FP4 where it is exact, kernel operands elsewhere --------------

ALIGN = 16  # every part of a message starts 16-byte aligned (the kernels' TMA and vector loads)


def _check_ring_recipe(recipe: str) -> None:
    _checks.check_recipe(recipe)
    if recipe in _layout.SMOOTHS_K:  # a K mean over the whole sequence is not a shard's
        raise UnsupportedError(
            f"recipe: {recipe!r} smooths K by its mean over the sequence, which the ring's "
            "per-shard quantization does not compute; use fp8 or fp8-fast"
        )


def wire_formats(recipe: str) -> dict:
    """What a ring message carries for K and V under `recipe`: "nvfp4" / "mxfp4" (packed FP4:
    E2M1 nibbles and row-major block scales, folded into the kernel operand on arrival without
    requantizing) or "operand" (the kernel operand bytes). docs/distributed.md has the sizes."""
    _check_ring_recipe(recipe)
    k_rule, v_rule = _layout.fp4_rule(recipe, "k"), _layout.fp4_rule(recipe, "v")
    v_nvfp4 = v_rule is not None and v_rule[0] == "nvfp4"  # what _pack_v makes
    return {"k": k_rule[0] if k_rule else "operand", "v": "nvfp4" if v_nvfp4 else "operand"}


def message_parts(recipe: str, b: int, h_kv: int, s: int, d: int) -> list[tuple]:
    """(name, shape, dtype) of each part of the message holding an s-token shard's K and V, in
    order; each part starts on an ALIGN-byte boundary."""
    fmt = wire_formats(recipe)
    code, u8 = _layout.operand_dtype(recipe), torch.uint8
    pitch = _layout.operand_shapes((b, s, h_kv, d), "v")[0][3]
    if fmt["k"] == "operand":
        tiles = -(-s // TILE)
        parts = [("k_data", (b, h_kv, s, d), code), ("k_scale", (b, h_kv, tiles), torch.float32)]
    else:
        rows = s + (fmt["k"] == "mxfp4")  # MXFP4 keeps the amax token: it sets the fold offset
        block = _layout.PACKED_BLOCK[fmt["k"]]
        parts = [
            ("k_packed", (b, h_kv, rows, d // 2), u8),
            ("k_scales", (b, h_kv, rows, d // block), u8),
        ]
    if fmt["v"] == "operand":
        return parts + [("v_data", (b, h_kv, d, pitch), code)]
    block = _layout.PACKED_BLOCK[fmt["v"]]
    return parts + [
        ("v_packed", (b, h_kv, d, pitch // 2), u8),
        ("v_scales", (b, h_kv, d, pitch // block), u8),
    ]


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def message_bytes(recipe: str, b: int, h_kv: int, s: int, d: int) -> dict:
    """Bytes of one ring message (parts padded to ALIGN): {"k", "v", "total", "bf16"}, where
    "bf16" is what BF16 K and V of the same tokens take."""
    sizes = {"k": 0, "v": 0}
    for name, shape, dtype in message_parts(recipe, b, h_kv, s, d):
        sizes[name[0]] += _aligned(_nbytes(shape, dtype))
    return {**sizes, "total": sizes["k"] + sizes["v"], "bf16": 2 * b * h_kv * s * d * 2}


def _to_message(tensors) -> torch.Tensor:
    sizes = [_aligned(t.numel() * t.element_size()) for t in tensors]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8, device=tensors[0].device)
    at = 0
    for t, n in zip(tensors, sizes):
        raw = _as_bytes(t)
        buf[at : at + raw.numel()] = raw
        at += n
    return buf


def _from_message(buf: torch.Tensor, parts) -> dict:
    out, at = {}, 0
    for name, shape, dtype in parts:
        n = _nbytes(shape, dtype)
        out[name] = buf[at : at + n].view(dtype).reshape(shape)
        at += _aligned(n)
    return out


def _pack_rows(x: torch.Tensor, fmt: str, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed FP4 of every (batch, head) slice of x [b, rows, h, cols] along cols, one tensor
    scale per slice (NVFP4: from the slice's amax): (packed U8 [b, h, rows, cols / 2], scales U8
    [b, h, rows, cols / block])."""
    b, rows, h, cols = x.shape
    block = _layout.PACKED_BLOCK[fmt]
    packed = torch.empty((b, h, rows, cols // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((b, h, rows, cols // block), dtype=torch.uint8, device=x.device)
    s_enc = torch.empty((b, h, 1), dtype=torch.float32, device=x.device)
    for bi in range(b):
        for hi in range(h):
            _ops.quantize_packed_into(
                x[bi : bi + 1, :, hi : hi + 1],
                fmt,
                rule,
                packed[bi, hi].view(1, rows, 1, cols // 2),
                scales[bi, hi].view(1, rows, 1, cols // block),
                s_enc[bi, hi] if fmt == "nvfp4" else None,
            )
    return packed, scales


def _pack_k(kb: torch.Tensor, amax: torch.Tensor, recipe: str, fmt: str):
    """K of a BSHD shard as packed FP4 rows with the whole sequence's statistics: the amax token
    after the shard gives every (batch, head) slice its global NVFP4 tensor scale / MXFP4
    largest exponent (as in quantize_shard); MXFP4 keeps that token in the message."""
    s = kb.shape[1]
    ext = torch.cat([kb, amax.to(kb.dtype).unsqueeze(1)], 1)
    packed, scales = _pack_rows(ext, fmt, _layout.fp4_rule(recipe, "k")[1])  # the operand's rule
    rows = s + (fmt == "mxfp4")
    return packed[:, :, :rows].contiguous(), scales[:, :, :rows].contiguous()


def _pack_v(vb: torch.Tensor, amax: torch.Tensor):
    """nvfp4-all's V (NVFP4 along tokens) as packed rows of V^T [b, h, d, pitch]: tokens padded
    with zeros to the operand pitch, then one 16-token block holding the amax (the global tensor
    scale), which does not travel."""
    b, s, h, d = vb.shape
    pitch = _layout.operand_shapes(vb.shape, "v")[0][3]
    vt = vb.new_zeros((b, d, h, pitch + _layout.V_TOKEN_PAD))  # [b, channel, h, token]
    vt[..., :s] = vb.permute(0, 3, 2, 1)
    vt[..., pitch] = amax.to(vb.dtype).transpose(1, 2)
    _, rule = _layout.fp4_rule("nvfp4-all", "v")
    packed, scales = _pack_rows(vt, "nvfp4", rule)  # [b, h, d, ...]
    block = _layout.PACKED_BLOCK["nvfp4"]
    return packed[..., : pitch // 2].contiguous(), scales[..., : pitch // block].contiguous()


def _unpack_message(buf, recipe, b, h_kv, s, d, k_factor):
    """Kernel operands (k_data, k_scale, v_data) of a received message; V's channel scales are
    global (the same on every rank) and are the receiver's own."""
    fmt = wire_formats(recipe)
    t = _from_message(buf, message_parts(recipe, b, h_kv, s, d))
    e4m3 = _layout.E4M3
    if fmt["k"] == "operand":
        kd, ks = t["k_data"], t["k_scale"]
    else:
        packed, scales = t["k_packed"], t["k_scales"]
        rows = packed.shape[2]
        if s == 0:
            kd = torch.empty((b, h_kv, 0, d), dtype=e4m3, device=buf.device)
        else:
            kd, _ = _ops.repack_operand(
                packed.view(b * h_kv, rows, 1, d // 2),
                scales.view(b * h_kv, rows, 1, -1),
                fmt["k"],
                recipe,
                "k",
            )
            kd = kd.view(b, h_kv, rows, d)
            if rows > s:
                kd = kd[:, :, :s].contiguous()
        ks = k_factor.expand(b, h_kv, -(-s // TILE)).contiguous()
    if fmt["v"] == "operand":
        return kd, ks, t["v_data"]
    packed, scales = t["v_packed"], t["v_scales"]
    pitch = 2 * packed.shape[3]
    if pitch == 0:
        return kd, ks, torch.empty((b, h_kv, d, 0), dtype=e4m3, device=buf.device)
    # V^T rows repack as Q/K rows do (NVFP4 along the last dim), in token order...
    natural, _ = _ops.repack_operand(
        packed.view(b * h_kv, d, 1, pitch // 2),
        scales.view(b * h_kv, d, 1, -1),
        "nvfp4",
        recipe,
        "k",
    )
    # ...then take the operand's key order inside 16-key groups; padding keys are 0.
    key_at = _layout.v_key_at(pitch, buf.device)
    codes = natural.view(torch.uint8).view(b, h_kv, d, pitch).index_select(3, key_at)
    if pitch > s:
        codes[..., key_at >= s] = 0
    return kd, ks, codes.view(e4m3)


def ring_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    recipe: str | None = None,
    return_lse: bool = False,
    layout: str = "bshd",
    group=None,
    zigzag: bool = False,
    stats: dict | None = None,
    overlap: bool = False,
):
    """Attention of a sequence sharded across `group`, K/V passed around a ring.

    q, k, v: this rank's shard (attn_func's layouts; CPU float16/bfloat16/float32, CUDA
    float16/bfloat16), cut by `shard` with the same `zigzag` (use zigzag=True for causal: equal
    work per rank). Q, K, V are quantized once (quantize_shard: the whole sequence's operand
    bytes), then world - 1 times each rank sends the K/V operands it holds to the next rank while
    it attends to them; partial outputs merge by their LSE in float32. Returns this rank's shard
    of o (and lse), within float32 rounding of attn_func on the whole sequence (docs/
    distributed.md). `stats` (a dict), when given, receives messages, bytes_sent and bf16_bytes
    (what BF16 K and V of the same tokens would have taken). overlap=True attends while each
    message travels; the default waits for it first, because the engine's persistent grid holds
    every SM, so a peer's NCCL kernel can wait for a whole attention kernel: 132 ms overlapped vs
    95 ms not, for a 200 MiB message that travels in 0.8 ms (2 H200s, s = 128k, nvfp4;
    bench/cp_profile.py, docs/distributed.md).
    """
    _require_group(group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    recipe = _defaults.get_default_recipe() if recipe is None else recipe  # checked collectively
    base = _local_checks(q, k, v, softmax_scale, causal, recipe, layout, zigzag)

    def checks():
        sig = base()
        _checks.check_bool(return_lse, "return_lse")
        _checks.check_bool(overlap, "overlap")
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            _checks.check_quantize_dtype(t, name)
        return sig

    _, table = _agree(group, checks)
    lens = table[:, 0].tolist()
    ranges = _check_sharding(lens, zigzag)
    stats = _new_stats(stats)
    qb, kb, vb = (_layout.to_bshd(t, layout) for t in (q, k, v))
    b, s_l, h, d = qb.shape
    h_kv, scale = kb.shape[2], _checks.check_softmax_scale(softmax_scale)

    # Quantize once, with the whole sequence's statistics: every operand byte is the whole
    # sequence's. V's channel scales (and NVFP4 / MXFP4 K's factor) are then the same on every
    # rank and do not travel. K (and nvfp4-all's V) travel as packed FP4 where the recipe's
    # operand is a fold of it (wire_formats), the other parts as operand bytes.
    fmt = wire_formats(recipe)
    amax_k, amax_v = global_amax(kb, group), global_amax(vb, group)
    qd, qs = quantize_shard(qb, global_amax(qb, group), recipe, "q")
    kd, ks, k_ext_scale = _quantize_shard(kb, amax_k, recipe, "k")
    vd, vs = quantize_shard(vb, amax_v, recipe, "v")
    k_factor = k_ext_scale[:, :, :1]
    k_part = [kd, ks] if fmt["k"] == "operand" else list(_pack_k(kb, amax_k, recipe, fmt["k"]))
    v_part = [vd] if fmt["v"] == "operand" else list(_pack_v(vb, amax_v))
    stats["wire"] = dict(fmt)
    first = [r[0][1] - r[0][0] for r in ranges]  # length of each rank's first chunk

    o = torch.zeros((b, s_l, h, d), dtype=torch.float32, device=qb.device)
    lse = torch.full((b, h, s_l), -torch.inf, dtype=torch.float32, device=qb.device)

    def attend(rows: int, kv, keys: int | None, masked: bool):
        """Queries from local token `rows` on, against the first `keys` keys of kv (all: None)."""
        kd_, ks_, vd_ = kv
        if keys is not None:
            pitch = _layout.operand_shapes((b, keys, h_kv, d), "v")[0][3]
            kd_, ks_, vd_ = kd_[:, :, :keys], ks_[:, :, : -(-keys // TILE)], vd_[..., :pitch]
        if rows >= s_l or kd_.shape[2] == 0:
            return
        out_dtype = torch.float32 if qb.device.type == "cpu" else q.dtype
        o_p, lse_p = _ops.attn_operands_fwd(
            qd[:, :, rows:].contiguous(),
            qs[:, :, rows // TILE :].contiguous(),
            kd_.contiguous(),
            ks_.contiguous(),
            vd_.contiguous(),
            vs,
            recipe,
            scale,
            masked,
            out_dtype,
        )
        o_view, lse_view = o[:, rows:], lse[:, :, rows:]
        merge_partials(o_view, lse_view, o_p, lse_p)

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    peers = [dist.get_global_rank(group, p) if group is not None else p for p in (nxt, prv)]
    kv, buf, src = (kd, ks, vd), _to_message(k_part + v_part), rank
    for step in range(world):
        reqs = []
        if step + 1 < world:  # send what we hold on while attending to it
            s_in = lens[(src - 1) % world]
            size = message_bytes(recipe, b, h_kv, s_in, d)["total"]
            recv = torch.empty(size, dtype=torch.uint8, device=qb.device)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, buf, peers[0], group),
                    dist.P2POp(dist.irecv, recv, peers[1], group),
                ]
            )
            sent = message_bytes(recipe, b, h_kv, lens[src], d)
            stats["messages"] += 1
            stats["bytes_sent"] += buf.numel()
            stats["k_bytes"] += sent["k"]
            stats["v_bytes"] += sent["v"]
            stats["bf16_bytes"] += sent["bf16"]
        if not overlap:  # gloo's send/recv works must be waited on once: a second wait hangs
            for r in reqs:
                r.wait()
            reqs, waited = [], reqs
        else:
            waited = reqs
        if not causal:
            attend(0, kv, None, False)
        elif src == rank:
            attend(0, kv, None, True)  # both chunks, in order: causal within the shard
        elif not zigzag:
            if src < rank:
                attend(0, kv, None, False)  # earlier ranks' tokens: all visible; later: none
        elif src < rank:
            attend(0, kv, first[src], False)  # their front chunk precedes both of ours
        else:
            attend(first[rank], kv, None, False)  # our back chunk follows both of theirs
        for r in reqs:
            r.wait()
        if waited:
            src = (src - 1) % world
            buf = recv
            kv = _unpack_message(recv, recipe, b, h_kv, lens[src], d, k_factor)

    lse = torch.where(lse == -torch.inf, torch.inf, lse)  # no key at all: attn_func's +inf
    return _layout.result(o.to(q.dtype), lse, layout, return_lse)


__all__ = [
    "NO_MULTICAST_ENV",
    "global_amax",
    "init_process_group",
    "merge_partials",
    "message_bytes",
    "message_parts",
    "quantize_shard",
    "ring_attn_func",
    "shard",
    "shard_ranges",
    "ulysses_attn_func",
    "unshard",
    "wire_formats",
]
