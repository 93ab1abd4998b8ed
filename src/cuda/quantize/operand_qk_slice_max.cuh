// Pass 2 of the Q/K quantizer, for the recipes that need a whole-slice statistic (a computed NVFP4
// s_enc, the MXFP4 fold offset): one max per (b, h) slice of the (smoothed) input.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_input.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn::detail::qk_operand {

// kMx false: max |x| bits of the slice (NaN-propagating amax). kMx true: max over the 32-element
// blocks with a finite amax of (amax bits + 1); 0 when there is none. out zeroed beforehand.
template <bool kF16, int kD, bool kMx>
__global__ void __launch_bounds__(kThreads)
    slice_max_kernel(XArgs a, const float* __restrict__ mean, uint32_t* __restrict__ out) {
  constexpr int kBlk = kMx ? kMxfp4Block : kNvfp4Block;
  constexpr int kNb = kD / kBlk;
  __shared__ uint32_t smem[kThreads / 32];
  const int64_t units = a.s * kNb;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    uint32_t m = 0;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < units;
         base += static_cast<int64_t>(gridDim.x) * kThreads) {
      const int64_t u = base + threadIdx.x;
      if (u < units) {
        const int64_t token = u / kNb;
        const int blk = static_cast<int>(u % kNb);
        const uint16_t* p = row_chunk<kD, kBlk>(a, bh, token, blk);
        uint32_t amax;
        if (mean == nullptr) {
          amax = raw_amax_bits<kF16, kBlk>(p);
        } else {
          float v[kBlk];
          load_plain<kF16, kBlk>(p, mean + bh * kD + blk * kBlk, v);
          amax = float_bits(block_amax(v, kBlk));
        }
        if constexpr (kMx) {
          if (amax < kF32Inf) m = max(m, amax + 1u);
        } else {
          m = max(m, amax);
        }
      }
    }
    m = block_max(m, smem);
    if (threadIdx.x == 0 && m != 0) atomicMax(out + bh, m);
  }
}

}  // namespace fp4attn::detail::qk_operand
