"""Layouts: the kernel operands' (include/fp4attn/operands.h) and the public functions' (BSHD or
BHSD inputs).

Every kernel fact here is read once, at import, from the extension (_C), which takes it from the
C++ headers; nothing is restated. Shapes are computed from those constants in Python rather than
by a _C call because fake tensors (torch.compile) have symbolic sizes; the C++ entry points check
every shape they receive, so a drift would fail loudly.
"""

from __future__ import annotations

import torch

from ._native import _C

E4M3 = torch.float8_e4m3fn
RECIPES = tuple(name for name, _ in _C.recipes())
GPU_BACKWARD_RECIPES = tuple(_C.GPU_BACKWARD_RECIPES)  # recipe.h kGpuBackwardRecipes
HEAD_DIMS = tuple(_C.HEAD_DIMS)
SCALE_TILE = _C.OPERAND_TILE_TOKENS  # one Q/K scale per this many tokens
V_TOKEN_PAD = _C.OPERAND_TOKEN_PAD  # V^T rows are padded to a multiple of this many tokens
PACKED_BLOCK = dict(_C.PACKED_BLOCK)  # packed FP4: values per scale along the last dim
NVFP4_SCALE_RULES = tuple(_C.NVFP4_SCALE_RULES)
PAGED_ERRORS = dict(_C.PAGED_ERRORS)  # paged_kv.h: device error flag bit -> what it means

_DATA_DTYPE = {
    (r, role): getattr(torch, _C.operand_data_dtype(r, role)) for r in RECIPES for role in "qkv"
}
# recipe.h recipe_smooths_k: the recipes whose K is smoothed whatever smooth_k says.
SMOOTHS_K = tuple(r for r in RECIPES if _C.recipe_smooths_k(r))
_FP4_RULE = {(r, role): _C.operand_fp4_rule(r, role) for r in RECIPES for role in ("q", "k", "v")}


def operand_dtype(recipe: str, role: str = "q") -> torch.dtype:
    """The dtype of a role's operand data: bfloat16 for bf16, int8 for the int8 recipes' Q and K,
    float8_e4m3fn otherwise."""
    dtype = _DATA_DTYPE.get((recipe, role))
    return dtype if dtype is not None else getattr(torch, _C.operand_data_dtype(recipe, role))


def operand_shapes(x_shape, role: str):
    """(data shape, scale shape) of the operand of a BSHD input (operands.h layouts)."""
    b, s, h, d = x_shape
    if role == "v":
        return (b, h, d, -(-s // V_TOKEN_PAD) * V_TOKEN_PAD), (b, h, d)
    return (b, h, s, d), (b, h, -(-s // SCALE_TILE))


def fp4_rule(recipe: str, role: str) -> tuple[str, str] | None:
    """(format, scale rule) of the FP4 block quantizer behind a role's operand ("nvfp4" or
    "mxfp4", a rule name), or None (E4M3 and BF16 operands, fp4-direct's V): packed FP4 made
    with it folds into the operand's bytes."""
    return _FP4_RULE[(recipe, role)]


# ---- V's key order ----------------------------------------------------------------------------
# V^T holds the keys of every group of OPERAND_V_KEY_GROUP permuted (operands.h operand_v_key_at).
# That permutation moves the bits of an index within its group, so an index array is a sum of
# per-bit weights, computed on the tensors' device (no host copy: CUDA graphs can capture it);
# the weights come from _C, and are checked against _C on a whole group here.


_GROUP = _C.OPERAND_V_KEY_GROUP


def _bit_weights(of) -> tuple[int, ...]:
    bits = _GROUP.bit_length() - 1
    weights = tuple(of(1 << b) for b in range(bits))
    for i in range(2 * _GROUP):  # two groups: each keeps its own keys
        want = i - i % _GROUP + sum(w for b, w in enumerate(weights) if (i >> b) & 1)
        if _GROUP != 1 << bits or of(i) != want:
            raise ImportError("fp4attn: _C's V key order is not a permutation of index bits")
    return weights


_KEY_AT = _bit_weights(_C.operand_v_key_at)
_POSITION_OF = _bit_weights(_C.operand_v_position_of)


def _permuted(n: int, device, weights) -> torch.Tensor:
    i = torch.arange(n, device=device)
    out = i & -_GROUP  # the first index of i's group
    for b, w in enumerate(weights):
        out = out + ((i >> b) & 1) * w
    return out


def v_key_at(pitch: int, device) -> torch.Tensor:
    """The key at each position 0..pitch-1 of a V^T row (operand_v_key_at), int64."""
    return _permuted(pitch, device, _KEY_AT)


def v_position_of(s: int, device) -> torch.Tensor:
    """The position of each key 0..s-1 in its V^T row (operand_v_position_of), int64."""
    return _permuted(s, device, _POSITION_OF)


# ---- the public functions' layouts ------------------------------------------------------------


def to_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "bshd" else t.transpose(1, 2)  # a view; the kernels take any strides


def result(o: torch.Tensor, lse: torch.Tensor, layout: str, return_lse: bool):
    """A public function's result from the BSHD output: o in the caller's layout, with lse."""
    # BHSD callers get a view of the BSHD output: .transpose(1, 2) of it is contiguous again.
    o = o if layout == "bshd" else o.transpose(1, 2)
    return (o, lse) if return_lse else o
