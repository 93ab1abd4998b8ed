// Pass 3 of the Q/K quantizer for the mxfp4 and bf16 recipes: quantize_kernel, one thread per
// block of a row (MXFP4: 32 values folded through the fold rows of operand_qk_tables.cuh with the
// slice offset from slice_max_kernel; bf16: 16 values as host-exact BF16).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/bf16_rne.h"
#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/operand_qk_host_nan.cuh"
#include "cuda/quantize/operand_qk_input.cuh"
#include "cuda/quantize/operand_qk_tables.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"

namespace fp4attn::detail::qk_operand {

enum class Mode { kBf16, kMx };  // NVFP4: nvfp4_operand_kernel

// 2^t as a float, t in [-149, 127].
__device__ __forceinline__ float pow2_float(int t) {
  return t >= -126 ? detail::pow2_normal(t) : __uint_as_float(1u << (t + 149));
}

// One thread per block of kBlk elements of a row; the scale of each 128-token tile is written by
// the thread of its first token's block 0.
// kSmooth: 1 / 0 when the launcher knows whether `mean` is set (separate code for the two cases
// avoids merging the smoothed and plain values into one set of registers), -1: tested here.
template <bool kF16, int kD, Mode kMode, Nvfp4ScaleRule kRule, int kSmooth = -1>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(XArgs a, const float* __restrict__ mean, const uint32_t* __restrict__ slice_max,
                    float static_s_enc, void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kBlk = kMode == Mode::kMx ? kMxfp4Block : kNvfp4Block;
  constexpr int kNb = kD / kBlk;
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    // The slice's factor (golden_operands.cc): mxfp4 2^t, bf16 1.
    float factor = 1.f;
    int t = 0;
    if constexpr (kMode == Mode::kMx) {
      const uint32_t m = slice_max[bh];
      if (m != 0) {
        // The block exponent of the largest finite block amax is the slice's largest.
        const float amax = bits_float(m - 1u);
        uint8_t unused;
        const int emax =
            static_cast<int>(mxfp4_quantize_block(&amax, 1, MxScaleRule::kRoundUp, &unused)) - 127;
        t = emax - 6;
      }
      factor = pow2_float(t);
    }
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < units;
         base += static_cast<int64_t>(gridDim.x) * kThreads) {
      const int64_t u = base + threadIdx.x;
      if (u >= units) continue;
      const int64_t token = u / kNb;
      const int blk = static_cast<int>(u % kNb);
      const uint16_t* src = row_chunk<kD, kBlk>(a, bh, token, blk);
      const bool smooth = kSmooth < 0 ? mean != nullptr : kSmooth == 1;
      const float* mean_c = smooth ? mean + bh * kD + blk * kBlk : nullptr;
      float v[kBlk];
      const int64_t out = (bh * a.s + token) * kD + blk * kBlk;  // element offset in data
      float amax = 0.f;  // block_amax(v) (NaN-propagating; a NaN's payload is irrelevant)
      if constexpr (kMode != Mode::kBf16) {
        uint4 r[kBlk / 8];
#pragma unroll
        for (int j = 0; j < kBlk / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(src) + j);
        unpack_plain<kF16, kBlk>(r, mean_c, v);
        amax =
            mean_c == nullptr ? bits_float(raw_amax_bits_of<kF16, kBlk>(r)) : block_amax(v, kBlk);
      }
      if constexpr (kMode == Mode::kBf16) {
        load_chunk<kF16, kBlk>(src, mean_c, v);
        uint32_t w[kBlk / 2];
#pragma unroll
        for (int i = 0; i < kBlk / 2; ++i) {
          w[i] = bf16_rne_bits(v[2 * i]) | (bf16_rne_bits(v[2 * i + 1]) << 16);
        }
        uint4* dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(data) + out);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else {
        // Magnitudes through the fold row (PRMT selectors), signs XORed in from the values' top
        // bytes wherever amax is finite and nonzero (operand_fast::mxfp4_operand_block).
        uint32_t o[8];
        operand_fast::mxfp4_operand_block(
            v, amax, t,
            [](int i) {
              const uint2 r = __ldg(g_mx_fold + i);
              return (uint64_t{r.y} << 32) | r.x;
            },
            o);
        uint4* dst = reinterpret_cast<uint4*>(static_cast<uint8_t*>(data) + out);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
      }
      if (blk == 0 && token % kOperandTileTokens == 0) {
        scale[bh * tiles + token / kOperandTileTokens] = factor;
      }
    }
  }
}

}  // namespace fp4attn::detail::qk_operand
