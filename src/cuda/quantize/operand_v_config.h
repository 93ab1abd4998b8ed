// Launch shape and parameters of the V operand kernels (operand_v_stats.cuh, operand_v_tile.cuh,
// operand_v_scales.cuh), shared by the kernels and their launcher (operand_v.cu).
#pragma once

#include <cstdint>

namespace fp4attn::detail::v_operand {

constexpr int kThreads = 256;
constexpr int kTileElems = 16384;  // tokens x head_dim per v_operand_kernel CTA
constexpr int kStatIters = 1;      // 32-token block rows per v_stats_kernel thread

struct VParams {
  const uint16_t* x;
  int64_t s, h;
  int64_t stride_b, stride_s, stride_h;  // elements
  int64_t pitch;                         // s_pad
  int64_t tiles;                         // tiles per slice (v_operand_kernel) or chunks (stats)
  void* data;
  float* scale;
  uint32_t* chan_amax;   // [b * h * d] FP32 bits, NaN-propagating
  uint32_t* slice_amax;  // [b * h] FP32 bits, NaN-propagating
  uint32_t* slice_fin;   // [b * h] FP32 bits + 1 of the largest finite 32-token block amax
  float tensor_scale;    // static s_enc (nvfp4-all) or 0
};

}  // namespace fp4attn::detail::v_operand
