// Kernel operands: the FP4-valued E4M3 (or BF16) tensors, with block scales folded in, that the
// forward kernels read (DESIGN.md "Where FP4 becomes FP8"; numerics.md §3 defines every rule).
//
// Layouts:
//   Q, K: data [b, h, s, d] (d contiguous: K-major for Q K^T), natural token order, E4M3 bytes
//         (BF16 for bf16, INT8 for the int8 recipes); scale FP32 [b, h, ceil(s / 128)]: the factor
//         of the rows of each 128-token tile.
//   V:    data [b, h_kv, d, s_pad] (tokens contiguous: V transposed), s_pad = s rounded up to 16,
//         keys permuted inside every 16-key group (operand_v_key_at below), padding keys (>= s)
//         0 wherever they land; scale FP32 [b, h_kv, d], the factor of each channel (unchanged by
//         the permutation, which never leaves a 16-key block).
// S = (Q_data K_data^T) * scale_q[row tile] * scale_k[key tile];
// O = (P V_data) * scale_v[channel] (P's own factor and the denominator per numerics.md §4).
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

enum class OperandRole { kQ, kK, kV };

constexpr int64_t kOperandTileTokens = 128;  // Q/K scale granularity along tokens
constexpr int64_t kOperandTokenPad = 16;     // V^T rows are padded to this many tokens

inline int64_t operand_v_pitch(int64_t s) {
  return (s + kOperandTokenPad - 1) / kOperandTokenPad * kOperandTokenPad;
}
inline int64_t operand_scale_tiles(int64_t s) {
  return (s + kOperandTileTokens - 1) / kOperandTileTokens;
}

// V key order. The P·V MMA takes P from registers as the FP8 wgmma A operand, where a thread
// holds 4 consecutive K positions 4t..4t+3 of each 16-wide group (t = lane % 4); the FP32
// accumulator of Q·K^T gives that thread keys {2t, 2t+1, 2t+8, 2t+9} of each 16-key group. So V^T
// stores at position p of group g the key 16g + 2(p >> 2) + (p & 1) + 8((p >> 1) & 1): positions
// 0..15 hold keys 0,1,8,9, 2,3,10,11, 4,5,12,13, 6,7,14,15, and P needs no shuffle. Every
// recipe's V uses this order (bf16 included); Q and K keep the natural order.
FP4ATTN_HD constexpr int64_t operand_v_key_at(int64_t position) {
  const int64_t p = position & 15;
  return (position & ~int64_t{15}) + 2 * (p >> 2) + (p & 1) + 8 * ((p >> 1) & 1);
}
// The inverse: the position of key `key` in its V^T row.
FP4ATTN_HD constexpr int64_t operand_v_position_of(int64_t key) {
  const int64_t k = key & 15;
  return (key & ~int64_t{15}) + 4 * ((k >> 1) & 3) + (k & 1) + 2 * (k >> 3);
}
// The permutation never leaves a group of this many keys; kOperandTokenPad keeps groups whole.
// Power-of-two block scales (MXFP4, fp4-direct's blocks) fold into E4M3 operands relative to the
// largest block exponent of the slice, so that the biggest block lands at 2^6 (the largest e with
// 6 * 2^e <= 448): the golden model, the GPU quantizers and the repack share this offset.
constexpr int kOperandPow2FoldTop = 6;

constexpr int64_t kOperandVKeyGroup = 16;
static_assert(kOperandTokenPad % kOperandVKeyGroup == 0);

// The dtype of an operand's data: BF16 for the bf16 recipe, INT8 for the int8 recipes' Q and K,
// E4M3 codes for every other.
constexpr DType operand_data_dtype(Recipe recipe, OperandRole role) {
  if (recipe == Recipe::kBf16) return DType::kBF16;
  if (recipe_qk_is_int8(recipe) && role != OperandRole::kV) return DType::kI8;
  return DType::kE4M3;
}

// The head dims every operand and kernel takes.
constexpr int64_t kOperandHeadDims[] = {64, 128};
constexpr bool operand_head_dim_supported(int64_t d) {
  for (int64_t h : kOperandHeadDims) {
    if (d == h) return true;
  }
  return false;
}

// The FP4 block quantizer behind an operand, where one is (numerics.md §3): NVFP4 Q/K of the
// nvfp4 recipes and fp4-direct, NVFP4 V (along tokens) of nvfp4-all, MXFP4 Q/K of mxfp4; each
// function gives the scale rule, or false for every other operand (E4M3, BF16, and fp4-direct's
// Direct-V). Packed FP4 quantized with this rule folds into the operand's bytes (the exact
// repack), which fp4attn.distributed's ring messages rely on.
constexpr bool operand_nvfp4_rule(Recipe recipe, OperandRole role, Nvfp4ScaleRule* rule) {
  if (role == OperandRole::kV) {
    if (recipe != Recipe::kNvfp4All) return false;
    *rule = Nvfp4ScaleRule::kNearest;
    return true;
  }
  switch (recipe) {
    case Recipe::kNvfp4:
    case Recipe::kNvfp4Fast:
    case Recipe::kNvfp4All:
      *rule = Nvfp4ScaleRule::kFourOverSix;  // rel-L2 0.133 instead of 0.144 (decisions.md)
      return true;
    case Recipe::kNvfp4Hx:
      *rule = Nvfp4ScaleRule::kRestricted;  // mantissas {1, 1.25, 1.5}: exact on FP8 MMA
      return true;
    case Recipe::kFp4Direct:
      *rule = Nvfp4ScaleRule::kNearest;  // the paper's plain rule
      return true;
    default:
      return false;
  }
}
constexpr bool operand_mxfp4_rule(Recipe recipe, OperandRole role, MxScaleRule* rule) {
  if (role == OperandRole::kV || recipe != Recipe::kMxfp4) return false;
  *rule = MxScaleRule::kRoundUp;
  return true;
}

struct OperandOptions {
  // Static NVFP4 encode scale s_enc (e.g. from a checkpoint) for nvfp4* Q/K and nvfp4-all V;
  // 0 computes it per (batch, head) from the slice's NaN-propagating amax.
  float tensor_scale = 0;
  // K only: subtract the per-(batch, kv head) channel mean first (numerics.md §3).
  bool smooth_k = false;
};

// Host reference (the golden model's definition). x: BSHD [b, s, h, d] BF16/FP16/FP32 values
// (FP32 must be BF16- or FP16-exact to match the GPU, which reads 16-bit inputs), d 64 or 128.
// data / scale as in the layouts above (data dtype kE4M3, or kBF16 for the bf16 recipe);
// mean FP32 [b, h, d] receives the K mean when opt.smooth_k (TensorView{} otherwise).
Status quantize_operand_host(const TensorView& x, Recipe recipe, OperandRole role,
                             const OperandOptions& opt, const TensorView& data,
                             const TensorView& scale, const TensorView& mean);

}  // namespace fp4attn
