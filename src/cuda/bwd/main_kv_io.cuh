// The main kernel's K / V tiles in and dK / dV out: the CTA's 128 keys of K, K^T and V into
// shared memory once (every thread, before the roles split), and a consumer warpgroup's dK and
// dV from its accumulators into the gradients after its last step.
#pragma once

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/device.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/params.h"
#include "fp4attn/operands.h"

namespace fp4attn::bwd {

// 4 x 4 byte transpose: byte j of out[i] is byte i of in[j] (four rows of four bytes become four
// columns), so that a transposed tile is written with 32-bit stores instead of byte stores.
__device__ __forceinline__ void transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), lo23 = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t hi01 = __byte_perm(in[0], in[1], 0x7362), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

// Word i of a 16-byte row.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// K (zero past s_k), K^T and V (un-permuted from the forward's V^T), swizzled, once per CTA.
// Each thread takes 4 x 16-byte rows and writes their transpose as 4-byte columns: K^T from 4
// keys x 16 channels, V from 4 channels x 16 positions of V^T (positions become keys through
// operand_v_key_at).
template <int D, bool kDhp>
__device__ __forceinline__ void load_kv(const BwdParams& p, MainSmem<D, kDhp>& sm, int bhk,
                                        int n0) {
  const uint8_t* kg = p.k + int64_t(bhk) * p.s_k * D;
  for (int idx = threadIdx.x; idx < (kKeyBlock / 4) * (D / 16); idx += kMainThreads) {
    const int r0 = (idx / (D / 16)) * 4, c16 = (idx % (D / 16)) * 16;
    uint4 rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rows[i] = make_uint4(0, 0, 0, 0);
      if (n0 + r0 + i < p.s_k) {
        rows[i] = *reinterpret_cast<const uint4*>(kg + int64_t(n0 + r0 + i) * D + c16);
      }
      *reinterpret_cast<uint4*>(&sm.k[swizzle_offset(r0 + i, c16, D)]) = rows[i];
    }
    if constexpr (!kDhp) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t in[4] = {word_of(rows[0], w), word_of(rows[1], w), word_of(rows[2], w),
                                word_of(rows[3], w)};
        uint32_t out[4];
        transpose4x4(in, out);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          *reinterpret_cast<uint32_t*>(&sm.kt[swizzle_offset(c16 + 4 * w + j, r0, kKeyBlock)]) =
              out[j];
        }
      }
    }
  }
  const uint8_t* vg = p.vt + int64_t(bhk) * D * p.vt_pitch;
  for (int idx = threadIdx.x; idx < (D / 4) * (kKeyBlock / 16); idx += kMainThreads) {
    const int c0 = (idx / (kKeyBlock / 16)) * 4, p16 = (idx % (kKeyBlock / 16)) * 16;
    uint4 rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rows[i] = make_uint4(0, 0, 0, 0);
      if (n0 + p16 < p.vt_pitch) {  // the pitch is a multiple of 16: whole groups
        rows[i] = *reinterpret_cast<const uint4*>(vg + int64_t(c0 + i) * p.vt_pitch + n0 + p16);
      }
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t in[4] = {word_of(rows[0], w), word_of(rows[1], w), word_of(rows[2], w),
                              word_of(rows[3], w)};
      uint32_t out[4];  // out[j]: channels c0..c0 + 3 of position p16 + 4w + j
      transpose4x4(in, out);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t key = uint32_t(operand_v_key_at(p16 + 4 * w + j));
        *reinterpret_cast<uint32_t*>(&sm.v[swizzle_offset(key, c0, D)]) = out[j];
      }
    }
  }
}

// dK and dV of the warpgroup's 64 keys in the gradients' dtype: dk 2^u_dk softmax_scale and
// dv 2^u_dv (the accumulators' units).
template <int D>
__device__ __forceinline__ void store_kv(const BwdParams& p, const float (&dk)[D / 2],
                                         const float (&dv)[D / 2], int u_dk, int u_dv, int bb,
                                         int hk, int key0, int t) {
  const Pow2 uk(u_dk), uv(u_dv);
#pragma unroll
  for (int e = 0; e < D / 2; ++e) {
    const int64_t key = key0 + 8 * accum_row_half(e);
    const int c = accum_col(e, t);
    if (key < p.s_k) {
      store_grad(p.dk, bb * p.dk_stride[0] + key * p.dk_stride[1] + hk * p.dk_stride[2] + c,
                 p.dk_f32, uk(dk[e]) * p.softmax_scale);
      store_grad(p.dv, bb * p.dv_stride[0] + key * p.dv_stride[1] + hk * p.dv_stride[2] + c,
                 p.dv_f32, uv(dv[e]));
    }
  }
}

}  // namespace fp4attn::bwd
