// The forward kernel's epilogue: a consumer warpgroup's O / l * v_scale[channel] in BF16/FP16
// (staged in shared memory and stored by TMA, or stored from registers), its LSE and its rows'
// integer reference m. Rows without a valid key give O = 0, LSE = +inf, m = -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/fwd/config.h"
#include "cuda/fwd/p_gen.cuh"
#include "cuda/fwd/params.h"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90 {

// Named barriers 3 and 4: one consumer warpgroup's epilogue staging.
constexpr int kEpilogueBarrier = 3;

template <int D, int PM, int N, int ON>
__device__ __forceinline__ void store_tile(const FwdParams& p, FwdSmem<D, PM, N>& sm, int cw,
                                           int batch, int head, int bh_kv, int m0, int r0, int t,
                                           const int (&rows)[2], const float (&o)[ON],
                                           const RowState& st, const float (&ones_l)[2]) {
  constexpr bool kOnes = ones_sum<PM>();
  float inv[2], lse[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float l;
    if constexpr (kOnes) {
      l = ones_l[h2];  // column d of the ones block, this thread's row
    } else {
      l = st.l[h2];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
    }
    const bool empty = l == 0.f;
    inv[h2] = empty ? 0.f : 1.f / l;
    lse[h2] = empty ? INFINITY : (st.m[h2] - p_lift_log2<PM>() + log2f(l)) * 0.69314718055994531f;
  }
  const float* v_scale = p.v_scale + int64_t(bh_kv) * D;
  auto out_pair = [&](int i, float& v0, float& v1) {
    const int ch = Frag::col(i, t);
    const float f = inv[Frag::half(i)];
    v0 = o[i] * f * v_scale[ch];
    v1 = o[i + 1] * f * v_scale[ch + 1];
  };
  auto pack2 = [&](float v0, float v1) {
    if (p.out_fp16) {
      const __half2 h = __floats2half2_rn(v0, v1);
      return *reinterpret_cast<const uint32_t*>(&h);
    }
    const __nv_bfloat162 b = __floats2bfloat162_rn(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&b);
  };
  if (p.o_tma) {
    // Stage the 64 x D tile in shared memory (swizzled: conflict-free), then one thread stores it
    // with TMA, which also drops the rows past s_q. The previous tile's store must have finished
    // reading the buffer first.
    const int tid_wg = threadIdx.x % 128;
    if (tid_wg == 0) bulk_wait_read();
    named_barrier_sync(kEpilogueBarrier + cw, 128);
    uint8_t* out = sm.out[cw];
#pragma unroll
    for (int i = 0; i < D / 2; i += 2) {
      float v0, v1;
      out_pair(i, v0, v1);
      const int r = r0 + 8 * Frag::half(i);
      const int c = Frag::col(i, t);  // even: a 4-byte pair
      const int box = c / 64, cb = (c % 64) * 2;
      const int off = box * 64 * 128 + r * 128 + ((((cb >> 4) ^ (r & 7))) << 4) + (cb & 15);
      *reinterpret_cast<uint32_t*>(out + off) = pack2(v0, v1);
    }
    fence_async_shared();
    named_barrier_sync(kEpilogueBarrier + cw, 128);
    if (tid_wg == 0) {
#pragma unroll
      for (int box = 0; box < D / 64; ++box) {
        tma_store_4d(&p.tm_o, out + box * 64 * 128, box * 64, m0 + cw * 64, head, batch);
      }
      bulk_commit();
    }
  } else {
#pragma unroll
    for (int i = 0; i < D / 2; i += 2) {
      const int row = rows[Frag::half(i)];
      if (row >= p.s_q) continue;
      float v0, v1;
      out_pair(i, v0, v1);
      const int64_t off = int64_t(batch) * p.o_stride_b + int64_t(row) * p.o_stride_s +
                          int64_t(head) * p.o_stride_h + Frag::col(i, t);
      *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.o) + off) = pack2(v0, v1);
    }
  }
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rows[h2] < p.s_q) {
        p.lse[int64_t(batch) * p.lse_stride_b + int64_t(head) * p.lse_stride_h + rows[h2]] =
            lse[h2];
      }
    }
  }
  if (p.row_max != nullptr && t == 0) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rows[h2] < p.s_q) {
        p.row_max[int64_t(batch) * p.row_max_stride_b + int64_t(head) * p.row_max_stride_h +
                  rows[h2]] = inv[h2] == 0.f ? -INFINITY : st.m[h2];
      }
    }
  }
}

}  // namespace fp4attn::sm90
