// Kernel operands: the FP4-valued E4M3 (or BF16) tensors, with block scales folded in, that the
// forward kernels read (DESIGN.md "Where FP4 becomes FP8"; numerics.md §3 defines every rule).
//
// Layouts (natural key order):
//   Q, K: data [b, h, s, d] (d contiguous: K-major for Q K^T), E4M3 bytes (BF16 for bf16);
//         scale FP32 [b, h, ceil(s / 128)]: the factor of the rows of each 128-token tile.
//   V:    data [b, h_kv, d, s_pad] (tokens contiguous: V transposed), s_pad = s rounded up to 16,
//         padding 0; scale FP32 [b, h_kv, d], the factor of each channel.
// S = (Q_data K_data^T) * scale_q[row tile] * scale_k[key tile];
// O = (P V_data) * scale_v[channel] (P's own factor and the denominator per numerics.md §4).
#pragma once

#include <cstdint>

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
