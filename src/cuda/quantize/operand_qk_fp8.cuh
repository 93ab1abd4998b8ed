// Pass 3 of the Q/K quantizer for the fp8 and int8 recipes: tile_kernel, one CTA per 128-token
// tile (the scale is the tile's amax over all of d).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/operand_qk_input.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"

namespace fp4attn::detail::qk_operand {

// Four INT8 codes RNE(x * inv), clamped to +-127 as int8_quantize_block, in one word.
__device__ __forceinline__ uint32_t int8x4(float x0, float x1, float x2, float x3, float inv) {
  const float x[4] = {x0, x1, x2, x3};
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = min(max(__float2int_rn(__fmul_rn(x[i], inv)), -127), 127);
    w |= (uint32_t(c) & 0xFFu) << (8 * i);
  }
  return w;
}

// One CTA per (b, h, 128-token tile), the block rule over the whole tile (all of d):
// fp8 (fp8_quantize_block): scale = amax / 448, code = E4M3(x * (448 / amax)); NaN/Inf ->
// scale NaN, codes 0x7F. kInt8 (int8_quantize_block): scale = amax / 127, code = RNE(x * (127 /
// amax)); NaN/Inf -> scale NaN, codes 0. Both: amax 0 -> scale 1, codes 0.
template <bool kF16, int kD, bool kInt8>
__global__ void __launch_bounds__(kThreads, kD == 128 ? 3 : 4)
    tile_kernel(XArgs a, const float* __restrict__ mean, uint8_t* __restrict__ data,
                float* __restrict__ scale) {
  constexpr float kMax = kInt8 ? kInt8Max : kE4m3Max;
  constexpr int kNb = kD / kNvfp4Block;
  constexpr int kPerThread = kOperandTileTokens * kNb / kThreads;
  static_assert(kPerThread * kThreads == kOperandTileTokens * kNb);
  __shared__ uint32_t smem[kThreads / 32];
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      // Raw 16-bit inputs are kept (8 registers per 16 values); the (smoothed) floats are
      // recomputed, identically, for the codes.
      uint4 r[kPerThread][2];
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          const uint4* src =
              reinterpret_cast<const uint4*>(row_chunk<kD, kNvfp4Block>(a, bh, token, blk));
          r[k][0] = __ldg(src);
          r[k][1] = __ldg(src + 1);
        }
      }
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          if (mean == nullptr) {
            m = max(m, raw_amax_bits_of<kF16, kNvfp4Block>(r[k]));
          } else {
            float v[kNvfp4Block];
            unpack_plain<kF16, kNvfp4Block>(r[k], mean + bh * kD + blk * kNvfp4Block, v);
            m = max(m, float_bits(block_amax(v, kNvfp4Block)));
          }
        }
      }
      const float amax = bits_float(block_max(m, smem));
      const bool finite = detail::is_finite(amax);
      float sc = 1.f, inv = 0.f;
      if (!finite) {
        sc = bits_float(detail::kQuietNan);
      } else if (amax != 0.f) {
        sc = detail::div_rn(amax, kMax);
        inv = detail::div_rn(kMax, amax);
        if (!detail::is_finite(inv)) inv = bits_float(detail::kFltMaxBits);
      }
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          float v[kNvfp4Block];
          unpack_plain<kF16, kNvfp4Block>(r[k], mean ? mean + bh * kD + blk * kNvfp4Block : nullptr,
                                          v);
          // Finite tile: every product is finite, and e4m3x4_finite == float_to_e4m3 on every
          // finite float (swept on the host over all of them).
          uint32_t o[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if constexpr (kInt8) {
              const uint32_t wq = int8x4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3], inv);
              o[q] = !finite || amax == 0.f ? 0u : wq;
            } else {
              const uint32_t wq = operand_fast::e4m3x4_finite(
                  __fmul_rn(v[4 * q], inv), __fmul_rn(v[4 * q + 1], inv),
                  __fmul_rn(v[4 * q + 2], inv), __fmul_rn(v[4 * q + 3], inv));
              o[q] = !finite ? 0x7F7F7F7Fu : amax == 0.f ? 0u : wq;
            }
          }
          *reinterpret_cast<uint4*>(data + (bh * a.s + token) * kD + blk * kNvfp4Block) =
              make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
      if (threadIdx.x == 0) scale[bh * tiles + tile] = sc;
    }
  }
}

}  // namespace fp4attn::detail::qk_operand
