"""What the FlashAttention shims share (fp4attn.flash_attn for FA2's API,
fp4attn.flash_attn_interface for FA3's): the checks that accept an argument at its default and
refuse, by name, a value fp4attn does not implement; the results in FlashAttention's conventions;
FA3's FP8 inputs as the fp8 recipe's operands; and flash_attn_with_kvcache over a PagedKVCache.

Nothing here reads a CUDA tensor's values on the host: the shims check and forward, so that a
CUDA call makes no device-to-host copy and no sync (the varlen paths excepted: attn_varlen_func
reads its offsets on the host, and FA3's FP8 varlen does as it does).
"""

from __future__ import annotations

import torch

from . import _checks, _defaults, _layout
from ._native import UnsupportedError
from .api import attn_quantized
from .paged import DecodePlan, PagedKVCache, append_kv, check_cache, decode
from .quantized import QuantizedQKV

E4M3 = torch.float8_e4m3fn

# ---- arguments fp4attn takes at their defaults only ------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Default values of the kvcache shims' signatures, shared so that an argument left at its default
# is recognized by identity (and its check skipped): the values are FlashAttention's.
NO_WINDOW = (-1, -1)
NO_SOFTCAP = 0.0
NO_CHUNK = 0
NO_MARGIN = 0
NO_SPLITS = 0  # flash_attn_with_kvcache's num_splits: the decode picks


def refuse_given(value: object, name: str, what: str) -> None:
    """An optional argument fp4attn has no implementation of: None only."""
    if value is not None:
        raise UnsupportedError(f"{name}: {what} is not supported by fp4attn (pass None)")


def check_dropout(dropout_p: object) -> None:
    if not _is_number(dropout_p):
        raise TypeError(f"dropout_p: expected a float, got {_checks._type_name(dropout_p)}")
    if not 0 <= dropout_p <= 1:
        raise ValueError(f"dropout_p: expected a probability in [0, 1], got {dropout_p!r}")
    if dropout_p != 0:
        raise UnsupportedError(
            f"dropout_p: attention dropout is not supported by fp4attn, got {dropout_p!r}; pass "
            "0.0 (FlashAttention's value for evaluation)"
        )


def check_window(window_size: object) -> None:
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(_is_int(w) for w in window_size)
    ):
        raise TypeError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    if tuple(window_size) != (-1, -1):
        raise UnsupportedError(
            f"window_size: sliding-window attention is not supported by fp4attn, got "
            f"{tuple(window_size)}; pass (-1, -1) (use causal=True for causal attention)"
        )


def check_softcap(softcap: object) -> None:
    if not _is_number(softcap):
        raise TypeError(f"softcap: expected a float, got {_checks._type_name(softcap)}")
    if softcap != 0:
        raise UnsupportedError(
            f"softcap: logit softcapping is not supported by fp4attn, got {softcap!r}; pass 0.0"
        )


def check_zero(value: object, name: str, what: str) -> None:
    """An int option whose default 0 means "off" (attention_chunk, sm_margin)."""
    if not _is_int(value):
        raise TypeError(f"{name}: expected an int, got {_checks._type_name(value)}")
    if value < 0:
        raise ValueError(f"{name}: expected a value >= 0, got {value}")
    if value != 0:
        raise UnsupportedError(f"{name}: {what} is not supported by fp4attn, got {value}; pass 0")


def check_pack_gqa(pack_gqa: object) -> None:
    """A scheduling hint of FA3 (None, True or False): accepted, with no effect on fp4attn, whose
    kernels pick their own GQA schedule (results never depend on it, in FA3 either)."""
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa: expected None or a bool, got {_checks._type_name(pack_gqa)}")


def check_dense_splits(num_splits: object) -> None:
    """FA3 flash_attn_func's num_splits: 1 (no split) or 0 (FA3's heuristic, which may pick 1);
    fp4attn's dense forward has no split-KV schedule to force."""
    if not _is_int(num_splits):
        raise TypeError(f"num_splits: expected an int, got {_checks._type_name(num_splits)}")
    if num_splits < 0:
        raise ValueError(f"num_splits: expected a value >= 0, got {num_splits}")
    if num_splits > 1:
        raise UnsupportedError(
            f"num_splits: fp4attn's dense forward does not split the keys, got {num_splits}; "
            "pass 1 (or 0, the heuristic)"
        )


def decode_splits(num_splits: object) -> int | None:
    """flash_attn_with_kvcache's num_splits as DecodePlan's: 0 (FA's heuristic) -> None."""
    if not _is_int(num_splits):
        raise TypeError(f"num_splits: expected an int, got {_checks._type_name(num_splits)}")
    if num_splits < 0:
        raise ValueError(f"num_splits: expected a value >= 0, got {num_splits}")
    return num_splits or None


def check_deterministic(deterministic: object, inputs: tuple) -> None:
    """deterministic=True holds where fp4attn's backward is deterministic: always on CPU (the golden
    model), on CUDA only under torch.use_deterministic_algorithms(True) (dQ summed in a fixed
    order, read when the backward runs); the forward is deterministic everywhere, so a call that
    cannot reach a backward needs nothing."""
    _checks.check_bool(deterministic, "deterministic")
    if not deterministic or torch.are_deterministic_algorithms_enabled():
        return
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    on_cuda = any(t.device.type == "cuda" for t in tensors)
    if on_cuda and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise UnsupportedError(
            "deterministic: fp4attn's GPU backward sums dQ in a fixed order only under "
            "torch.use_deterministic_algorithms(True); turn it on (and keep it on through "
            "backward()), or pass deterministic=False"
        )


def check_no_recipe(recipe: object) -> None:
    """flash_attn_with_kvcache: the cache's format (PagedKVCache.format) sets the numerics."""
    if recipe is not None:
        _checks.check_recipe(recipe)
        raise UnsupportedError(
            f"recipe: flash_attn_with_kvcache reads fp4attn's quantized cache, whose format "
            f"(k_cache.format) sets the numerics; got recipe {recipe!r}, pass None"
        )


# ---- results ----------------------------------------------------------------------------------


def fa2_result(out, q: torch.Tensor, return_attn_probs: bool):
    """FA2's return: out, or (out, softmax_lse, S_dmask). S_dmask is FA2's empty tensor (shape (0,),
    q's dtype) that it returns when dropout_p is 0, the only dropout fp4attn runs."""
    if not return_attn_probs:
        return out
    o, lse = out
    return o, lse, torch.empty((0,), dtype=q.dtype, device=q.device)


# ---- FA3's FP8 inputs as the fp8 recipe's operands ---------------------------------------------


def is_fp8(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == E4M3


def check_fp8_recipe(recipe: object) -> None:
    name = _defaults.resolve(recipe)
    if name != "fp8":
        raise UnsupportedError(
            f"recipe: float8_e4m3fn inputs run on the 'fp8' recipe's operands as given (no "
            f"re-quantization), got recipe {name!r}; pass recipe='fp8' (or run under "
            "fp4attn.use_recipe('fp8'))"
        )


def refuse_descales(descales: tuple) -> None:
    """Descales scale FP8 codes: with 16-bit inputs FA3 ignores them, fp4attn refuses them."""
    for value, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        if value is not None:
            raise ValueError(f"{name}: only float8_e4m3fn inputs take descales (pass None)")


def _check_fp8_inputs(q, k, v) -> None:
    dims = ("(batch, seqlen_q, heads, head_dim)", "(batch, seqlen_k, kv_heads, head_dim)")
    for t, name, d in ((q, "q", dims[0]), (k, "k", dims[1]), (v, "v", dims[1])):
        _checks.check_tensor(t, name, 4, d)
        _checks.check_device(t, name, q, "q")
        if t.dtype != E4M3:
            raise TypeError(f"{name}: dtype {t.dtype} differs from q's float8_e4m3fn")
        _checks.check_last_dim_contiguous(t, name)
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k: expected batch {q.shape[0]} and head_dim {q.shape[3]} like q, got shape "
            f"{tuple(k.shape)} {dims[1]}"
        )
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)} like k, got {tuple(v.shape)}")
    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q/k: number of heads {heads} is not a multiple of kv heads {kv_heads}")
    _checks.check_head_dim(q.shape[3], "q")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise UnsupportedError(
            "q: float8_e4m3fn inputs have no backward (FA3 has none either); call under "
            "torch.no_grad() or pass detached tensors"
        )


def _descale(value: object, name: str, batch: int, kv_heads: int, q: torch.Tensor):
    """A descale float32 [batch, kv_heads] (None: 1)."""
    if value is None:
        return torch.ones((batch, kv_heads), dtype=torch.float32, device=q.device)
    _checks.check_tensor(value, name, 2, "(batch, kv_heads)")
    _checks.check_device(value, name, q, "q")
    if value.dtype != torch.float32:
        raise TypeError(f"{name}: expected float32, got {value.dtype}")
    if tuple(value.shape) != (batch, kv_heads):
        raise ValueError(
            f"{name}: expected shape {(batch, kv_heads)} (batch, kv_heads), got "
            f"{tuple(value.shape)}"
        )
    # The values are read on the host on CPU only (a CUDA check would be a sync): a scale is
    # >= 0 or NaN, as the operands' scales (api._check_scale_values).
    if value.device.type == "cpu" and bool(((value < 0) | torch.isinf(value)).any()):
        raise ValueError(f"{name}: expected finite values >= 0, got {value.tolist()}")
    return value


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def fp8_operands(q, k, v, q_descale, k_descale, v_descale) -> QuantizedQKV:
    """The fp8 recipe's operands (operands.h layouts) of FA3's FP8 inputs, the E4M3 codes as given:
    Q/K moved to [b, h, s, d], each 128-token tile scaled by its head's descale (a query head
    takes its kv head's, FA3's [batch, kv_heads] convention); V transposed to [b, h_kv, d,
    s rounded up to 16] with its keys in the operand order, each channel scaled by the descale.
    Only 1-byte codes are moved; the output dtype is bfloat16, as FA3's for FP8 inputs."""
    _check_fp8_inputs(q, k, v)
    b, _, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    qd, kd, vd = (
        _descale(x, n, b, h_kv, q)
        for x, n in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale"))
    )
    _, q_tiles_shape = _layout.operand_shapes(q.shape, "q")
    _, k_tiles_shape = _layout.operand_shapes(k.shape, "k")
    v_shape, _ = _layout.operand_shapes(v.shape, "v")
    group = h // h_kv
    q_head = qd[:, :, None].expand(b, h_kv, group).reshape(b, h)
    q_scale = q_head[:, :, None].expand(q_tiles_shape).contiguous()
    k_scale = kd[:, :, None].expand(k_tiles_shape).contiguous()
    v_scale = vd[:, :, None].expand(b, h_kv, d).contiguous()
    q_data = _bytes(q).transpose(1, 2).contiguous().view(E4M3)
    k_data = _bytes(k).transpose(1, 2).contiguous().view(E4M3)
    v_data = torch.zeros(v_shape, dtype=torch.uint8, device=v.device)  # padding keys are 0
    v_data.index_copy_(3, _layout.v_position_of(s_k, v.device), _bytes(v).permute(0, 2, 3, 1))
    return QuantizedQKV(
        q_data, q_scale, k_data, k_scale, v_data.view(E4M3), v_scale, "fp8", torch.bfloat16
    )


def attn_fp8(q, k, v, descales, softmax_scale, causal, recipe, return_lse):
    """FA3 attention on FP8 inputs: attn_quantized on their fp8 operands (bfloat16 output)."""
    check_fp8_recipe(recipe)
    operands = fp8_operands(q, k, v, *descales)
    return attn_quantized(operands, softmax_scale, causal, return_lse)


def _host_offsets(cu: object, name: str, total: int, q: torch.Tensor) -> list[int]:
    """FA's cu_seqlens (int32 [batch + 1]) read on the host, as attn_varlen_func reads them."""
    _checks.check_tensor(cu, name, 1, "(batch + 1)")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name}: expected int32, got {cu.dtype}")
    _checks.check_device(cu, name, q, "q")
    if cu.numel() < 1:
        raise ValueError(f"{name}: expected batch + 1 >= 1 offsets, got none")
    _check_offsets_host(cu, name, total)
    return [int(x) for x in cu.tolist()]


def _check_max_seqlen(bound: object, name: str, offsets: list[int]) -> None:
    if bound is None:
        return
    if not _is_int(bound):
        raise TypeError(f"{name}: expected an int, got {_checks._type_name(bound)}")
    longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
    if longest > bound:
        raise ValueError(f"{name}: {bound} is shorter than the longest sequence ({longest})")


def attn_fp8_varlen(q, k, v, cu_seqlens, max_seqlens, descales, softmax_scale, causal, recipe,
                    return_lse):  # fmt: skip
    """FA3's varlen attention on FP8 inputs: each sequence on its own fp8 operands (with its row of
    the descales), as attn_varlen_func runs each sequence; the offsets are read on the host (a
    device-to-host copy on CUDA, as there). Returns o bfloat16 [total_q, h, d] (0 past the last
    offset) and lse float32 [h, total_q] (+inf for rows without keys)."""
    check_fp8_recipe(recipe)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _checks.check_tensor(t, name, 3, "(total_tokens, heads, head_dim)")
        _checks.check_device(t, name, q, "q")
    _checks.check_softmax_scale(softmax_scale)
    _checks.check_bool(causal, "causal")
    cq = _host_offsets(cu_seqlens[0], "cu_seqlens_q", q.shape[0], q)
    ck = _host_offsets(cu_seqlens[1], "cu_seqlens_k", k.shape[0], q)
    if len(cq) != len(ck):
        raise ValueError(
            f"cu_seqlens_k: {len(ck) - 1} sequences, but cu_seqlens_q has {len(cq) - 1}"
        )
    _check_max_seqlen(max_seqlens[0], "max_seqlen_q", cq)
    _check_max_seqlen(max_seqlens[1], "max_seqlen_k", ck)
    batch, kv_heads = len(cq) - 1, k.shape[1]
    names = ("q_descale", "k_descale", "v_descale")
    scales = [_descale(x, n, batch, kv_heads, q) for x, n in zip(descales, names)]
    o = torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), dtype=torch.float32, device=q.device)
    for i in range(batch):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        operands = fp8_operands(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], *(s[i : i + 1] for s in scales)
        )
        out, seq_lse = attn_quantized(operands, softmax_scale, causal, return_lse=True)
        o[q0:q1] = out[0]
        lse[:, q0:q1] = seq_lse[0]
    return (o, lse) if return_lse else o


# ---- flash_attn_with_kvcache over a PagedKVCache --------------------------------------------

_CACHE_RULE = (
    "fp4attn's KV cache is quantized (NVFP4 or FP8 codes with their scales, written by "
    "fp4attn.append_kv), so a plain K/V tensor would have to be quantized again on every call; "
    "make one with fp4attn.PagedKVCache.empty(num_pages, page_size, kv_heads, head_dim) and pass "
    "it as k_cache, with v_cache None or the same object"
)


def paged_cache(k_cache: object, v_cache: object) -> PagedKVCache:
    if not isinstance(k_cache, PagedKVCache):
        raise TypeError(
            f"k_cache: expected a fp4attn.PagedKVCache, got {_checks._type_name(k_cache)}: "
            + _CACHE_RULE
        )
    if v_cache is not None and v_cache is not k_cache:
        if not isinstance(v_cache, PagedKVCache):
            raise TypeError(
                f"v_cache: expected None or k_cache itself, got {_checks._type_name(v_cache)}: "
                + _CACHE_RULE
            )
        raise ValueError(
            "v_cache: expected None or k_cache itself (a PagedKVCache holds both K and V), got "
            "another PagedKVCache"
        )
    return check_cache(k_cache)


def _int32(t: object, name: str, rank: int, dims: str, cache: PagedKVCache) -> torch.Tensor:
    _checks.check_tensor(t, name, rank, dims)
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected int32, got {t.dtype}")
    _checks.check_device(t, name, cache.k_data, "the cache")
    return t


def _cached_lengths(cache_seqlens, batch: int, table: torch.Tensor, cache: PagedKVCache):
    """cache_seqlens as int32 [batch] on the cache's device; None (FA's default, no new tokens):
    every sequence spans its whole table row, as FA reads a paged cache without lengths."""
    device = cache.device
    if cache_seqlens is None:
        full = table.shape[1] * cache.page_size
        return torch.full((batch,), full, dtype=torch.int32, device=device)
    if _is_int(cache_seqlens):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens: expected a value >= 0, got {cache_seqlens}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(
            f"cache_seqlens: expected an int or an int32 tensor (batch), got "
            f"{_checks._type_name(cache_seqlens)}"
        )
    _int32(cache_seqlens, "cache_seqlens", 1, "(batch)", cache)
    if cache_seqlens.shape[0] != batch:
        raise ValueError(
            f"cache_seqlens: {cache_seqlens.shape[0]} sequences, but the page table has {batch} "
            "rows"
        )
    return cache_seqlens


def _slots(table: torch.Tensor, rows, positions, cache: PagedKVCache) -> torch.Tensor:
    """The slot of cache position `positions` of sequence `rows` (int64 tensors of one shape),
    computed on the device. A position outside the table row gets a slot past the cache, which
    append_kv refuses on CPU and flags on CUDA (cache.check_errors())."""
    width, page_size = table.shape[1], cache.page_size
    past = cache.num_pages * page_size
    if width == 0:
        return torch.full_like(positions, past)
    block = positions.div(page_size, rounding_mode="floor")
    inside = (block >= 0) & (block < width)
    page = table[rows, block.clamp(0, width - 1)].long()
    return (page * page_size + positions.remainder(page_size)).masked_fill(~inside, past)


def _new_tokens(k, v, lengths, table, cache, cu_seqlens_k_new):
    """(k, v as [tokens, kv_heads, d], their slot mapping, new tokens per sequence) of the new
    keys: dense k [batch, s_new, kv_heads, d] at positions lengths .. lengths + s_new - 1, or
    FA3's packed k [total_new, kv_heads, d] with cu_seqlens_k_new (tokens past its last offset
    are skipped, slot -1)."""
    batch, device = table.shape[0], cache.device
    if cu_seqlens_k_new is None:
        dims = "(batch, seqlen_new, kv_heads, head_dim)"
        for t, name in ((k, "k"), (v, "v")):
            _checks.check_tensor(t, name, 4, dims)
            if t.shape[0] != batch:
                raise ValueError(f"{name}: batch {t.shape[0]}, but the page table has {batch} rows")
        s_new = k.shape[1]
        steps = torch.arange(s_new, device=device)
        rows = torch.arange(batch, device=device)[:, None].expand(batch, s_new)
        slots = _slots(table, rows, lengths.long()[:, None] + steps, cache).reshape(-1)
        # flatten(0, 1) is a view for contiguous k and for slices of a packed QKV projection.
        return k.flatten(0, 1), v.flatten(0, 1), slots, s_new
    cu = _int32(cu_seqlens_k_new, "cu_seqlens_k_new", 1, "(batch + 1)", cache)
    if cu.shape[0] != batch + 1:
        raise ValueError(
            f"cu_seqlens_k_new: expected batch + 1 = {batch + 1} offsets, got {cu.shape[0]}"
        )
    for t, name in ((k, "k"), (v, "v")):
        _checks.check_tensor(t, name, 3, "(total_new, kv_heads, head_dim) with cu_seqlens_k_new")
    if cu.device.type == "cpu":  # on CUDA the offsets are not read on the host
        _check_offsets_host(cu, "cu_seqlens_k_new", k.shape[0])
    offsets = cu.long()
    token = torch.arange(k.shape[0], device=device)
    row = torch.searchsorted(offsets[1:].contiguous(), token, right=True)
    packed = row < batch
    row = row.clamp(max=max(batch - 1, 0))
    positions = lengths.long()[row] + token - offsets[row]
    slots = _slots(table, row, positions, cache).masked_fill(~packed, -1)
    return k, v, slots, cu[1:] - cu[:-1]


def _check_offsets_host(cu: torch.Tensor, name: str, total: int) -> None:
    values = [int(x) for x in cu.tolist()]
    if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])) or values[-1] > total:
        raise ValueError(
            f"{name}: expected non-decreasing offsets from 0 to at most {total} tokens, got "
            f"{values}"
        )


def _check_capacity(lengths, added, table, cache, table_name: str) -> None:
    """CPU: new tokens beyond a table row are refused here, in the caller's terms (append_kv
    would name a slot); CUDA reads no lengths (cache.check_errors() reports them there)."""
    if cache.device.type != "cpu":
        return
    capacity = table.shape[1] * cache.page_size
    if bool((lengths < 0).any()):
        raise ValueError(f"cache_seqlens: expected lengths >= 0, got {lengths.tolist()}")
    total = lengths.long() + (added.long() if isinstance(added, torch.Tensor) else added)
    over = (total > capacity).nonzero()
    if over.numel():
        i = int(over[0, 0])
        raise ValueError(
            f"cache_seqlens: sequence {i} holds {int(lengths[i])} tokens and gets "
            f"{int(total[i] - lengths[i])} new ones, beyond the {capacity} slots of its "
            f"{table_name} row ({table.shape[1]} pages of {cache.page_size})"
        )


def kvcache(
    q,
    k_cache,
    v_cache,
    k,
    v,
    cache_seqlens,
    table,
    table_name: str,
    softmax_scale,
    causal,
    num_splits,
    return_lse: bool,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
):
    """flash_attn_with_kvcache on a PagedKVCache: new k, v appended at cache_seqlens ..
    cache_seqlens + s_new - 1 (append_kv, slots computed on the device from the table), then
    decode with seq_lens = cache_seqlens + s_new (bottom-right causal, FA's convention)."""
    if table is None:
        raise ValueError(
            f"{table_name}: required: fp4attn's cache is paged (int32 (batch, max_pages) page ids)"
        )
    if (
        k is None and v is None and cu_seqlens_k_new is None and num_splits is NO_SPLITS
        and type(cache_seqlens) is torch.Tensor and isinstance(k_cache, PagedKVCache)
        and (v_cache is None or v_cache is k_cache)
    ):  # fmt: skip
        # A decode step: decode checks every argument; FA's names are given on failure only
        # (each duplicate check costs host time, which bounds an eager step).
        try:
            return decode(
                q, k_cache, table, cache_seqlens, softmax_scale, causal, cu_seqlens_q, return_lse
            )
        except (TypeError, ValueError):
            _int32(table, table_name, 2, "(batch, max_pages)", check_cache(k_cache))
            _cached_lengths(cache_seqlens, table.shape[0], table, k_cache)
            raise
    cache = paged_cache(k_cache, v_cache)
    _int32(table, table_name, 2, "(batch, max_pages)", cache)
    splits = decode_splits(num_splits)
    lengths = _cached_lengths(cache_seqlens, table.shape[0], table, cache)
    if (k is None) != (v is None):
        raise ValueError("k/v: pass both new k and v, or neither")
    if k is None:
        if cu_seqlens_k_new is not None:
            raise ValueError("cu_seqlens_k_new: given without new k/v")
        seq_lens = lengths
    else:
        if cache_seqlens is None:
            raise ValueError("cache_seqlens: required with new k/v (where to append them)")
        k2, v2, slots, added = _new_tokens(k, v, lengths, table, cache, cu_seqlens_k_new)
        _check_capacity(lengths, added, table, cache, table_name)
        append_kv(cache, k2, v2, slots)
        seq_lens = lengths + added
    if splits is None:
        return decode(q, cache, table, seq_lens, softmax_scale, causal, cu_seqlens_q, return_lse)
    plan = DecodePlan(cache, q, table, cu_seqlens_q, causal, softmax_scale, num_splits=splits)
    return plan.run(q, cache, table, seq_lens, cu_seqlens_q, return_lse=return_lse)
