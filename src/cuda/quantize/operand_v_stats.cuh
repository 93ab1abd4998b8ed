// The V pre-pass (fp8-style recipes, nvfp4-all with a computed s_enc, fp4-direct): v_stats_kernel,
// a column reduction over all tokens of each (b, h_kv) slice into the channel amax, the slice
// amax and the largest finite 32-token block amax (operand_v.cu says how it is laid out).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_v_config.h"
#include "cuda/quantize/operand_v_unit.cuh"

namespace fp4attn::detail::v_operand {

// 63 registers (4 CTAs an SM); one 32-token block row per thread, its 32 loads in flight.
template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, 4) v_stats_kernel(VParams p) {
  constexpr int kVecPerRow = kD / 8;
  constexpr int kBlockRows = kThreads / kVecPerRow;  // 32-token blocks per iteration
  __shared__ uint32_t s_chan[kD];
  __shared__ uint32_t s_fin, s_amax;
  for (int c = threadIdx.x; c < kD; c += kThreads) s_chan[c] = 0;
  if (threadIdx.x == 0) s_fin = s_amax = 0;

  // blockIdx: head fastest (neighbouring CTAs read neighbouring bytes of x), then chunk, batch.
  const int64_t bt = blockIdx.x / p.h, hi = blockIdx.x - bt * p.h;
  const int64_t bi = bt / p.tiles, chunk = bt - bi * p.tiles;
  const int64_t bh = bi * p.h + hi;
  const int j = threadIdx.x % kVecPerRow, row = threadIdx.x / kVecPerRow;
  const uint16_t* xs = p.x + bi * p.stride_b + hi * p.stride_h + j * 8;

  uint32_t cmax[4] = {0, 0, 0, 0};  // two channels per word, |x| bits
  uint32_t fin = 0;                 // largest finite block amax (16-bit bits) + 1
  for (int it = 0; it < kStatIters; ++it) {
    const int64_t blk = (chunk * kStatIters + it) * kBlockRows + row;
    const int64_t tok0 = blk * kUnitTokens;
    if (tok0 >= p.s) break;
    uint32_t bm[4] = {0, 0, 0, 0};
#pragma unroll 8
    for (int i = 0; i < kUnitTokens; ++i) {
      if (tok0 + i < p.s) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(xs + (tok0 + i) * p.stride_s));
        bm[0] = __vmaxu2(bm[0], q.x & 0x7FFF7FFFu);
        bm[1] = __vmaxu2(bm[1], q.y & 0x7FFF7FFFu);
        bm[2] = __vmaxu2(bm[2], q.z & 0x7FFF7FFFu);
        bm[3] = __vmaxu2(bm[3], q.w & 0x7FFF7FFFu);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      cmax[k] = __vmaxu2(cmax[k], bm[k]);
      const uint32_t lo = bm[k] & 0xFFFFu, hi16 = bm[k] >> 16;
      if (lo < kNonFinite16<kF16>) fin = max(fin, lo + 1);
      if (hi16 < kNonFinite16<kF16>) fin = max(fin, hi16 + 1);
    }
  }
  __syncthreads();  // shared init
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    atomicMax(&s_chan[j * 8 + 2 * k], cmax[k] & 0xFFFFu);
    atomicMax(&s_chan[j * 8 + 2 * k + 1], cmax[k] >> 16);
  }
  if (fin != 0) atomicMax(&s_fin, fin);
  __syncthreads();
  for (int c = threadIdx.x; c < kD; c += kThreads) {
    const uint32_t bits = __float_as_uint(to_float<kF16>(s_chan[c]));
    atomicMax(&p.chan_amax[bh * kD + c], bits);
    atomicMax(&s_amax, bits);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicMax(&p.slice_amax[bh], s_amax);
    if (s_fin != 0) atomicMax(&p.slice_fin[bh], __float_as_uint(to_float<kF16>(s_fin - 1)) + 1);
  }
}

}  // namespace fp4attn::detail::v_operand
