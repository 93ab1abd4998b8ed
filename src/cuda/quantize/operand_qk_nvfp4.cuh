// Pass 3 of the Q/K quantizer for the NVFP4 recipes (nvfp4, nvfp4-hx, nvfp4-fast, nvfp4-all,
// fp4-direct): nvfp4_operand_kernel for the slices with a finite scale table, from the tables of
// nvfp4_slice_setup_kernel and fold_table_kernel (operand_qk_tables.cuh), and
// nvfp4_operand_generic_kernel, by the reference functions, for the others.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/operand_qk_input.cuh"
#include "cuda/quantize/operand_qk_tables.cuh"
#include "cuda/quantize/packed_blocks.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"

namespace fp4attn::detail::qk_operand {

// 16 bytes -> one 16-byte store.
__device__ __forceinline__ void store16(void* dst, const uint8_t* b) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[q] = uint32_t{b[4 * q]} | (uint32_t{b[4 * q + 1]} << 8) | (uint32_t{b[4 * q + 2]} << 16) |
           (uint32_t{b[4 * q + 3]} << 24);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// The folded bytes of one NVFP4 block by the generic reference functions (any s_enc, e.g. a
// static scale beyond packed::nvfp4_table_finite). Out of line: rarely run.
template <Nvfp4ScaleRule kRule>
__device__ __noinline__ void nvfp4_fold_generic(const float* v, float s_enc, uint8_t* dst) {
  uint8_t codes[kNvfp4Block];
  const uint8_t sc = nvfp4_quantize_block(v, kNvfp4Block, s_enc, kRule, codes);
  // E4M3_RNE(e2m1 * scale / 8): the product and the / 8 are exact in FP32.
  const float f = e4m3_to_float(sc);
  uint8_t bytes[kNvfp4Block];
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) {
    bytes[i] =
        sc == 0x7F
            ? uint8_t{0x7F}
            : float_to_e4m3(detail::mul_rn(detail::mul_rn(e2m1_to_float(codes[i]), f), 0.125f));
  }
  store16(dst, bytes);
}

// The folded bytes of the block in the raw vectors r0, r1 (minus mean_c[i] when not null) by
// nvfp4_fold_generic (slices whose static s_enc is beyond packed::nvfp4_table_finite).
template <bool kF16, Nvfp4ScaleRule kRule>
__device__ __noinline__ uint4 nvfp4_fold_generic_raw(uint4 r0, uint4 r1, const float* mean_c,
                                                     float s_enc) {
  float v[kNvfp4Block];
  operand_fast::unpack8<kF16>(r0, v);
  operand_fast::unpack8<kF16>(r1, v + 8);
  if (mean_c != nullptr) {
    for (int i = 0; i < kNvfp4Block; ++i) v[i] = __fsub_rn(v[i], __ldg(mean_c + i));
  }
  uint4 o;
  nvfp4_fold_generic<kRule>(v, s_enc, reinterpret_cast<uint8_t*>(&o));
  return o;
}

// One NVFP4 block (nvfp4_quantize_block, then the fold E4M3(e2m1 * scale / 8)) of the 16 values
// in r0, r1 (minus mu when kSmooth), as the 16 folded bytes. s_enc finite > 0 with
// packed::nvfp4_table_finite; table: packed::nvfp4_fill_scale_table(s_enc).
// The scale math is exact and short: amax on the 16-bit bits (kSmooth: of the FP32 differences),
// amax / 6 by div6_16bit (exact for 16-bit amax values; kSmooth: a division), E4M3 codes by
// packed::e4m3_code_*, s_enc / f from the table; E2M1 magnitudes by packed::e2m1_mag_term sums
// (Four-Over-Six: packed::four_over_six_select), folded through g_nv_fold rows with the magnitude
// nibbles as PRMT selectors, the signs XORed in from the input bits (fold8_mag).
template <bool kF16, Nvfp4ScaleRule kRule, bool kSmooth>
__device__ __forceinline__ uint4 nvfp4_operand_block(const uint4& r0, const uint4& r1,
                                                     const float (&mu)[kNvfp4Block], float s_enc,
                                                     const float2* table) {
  float x[kNvfp4Block];
  operand_fast::unpack8<kF16>(r0, x);
  operand_fast::unpack8<kF16>(r1, x + 8);
  float amax;
  if constexpr (kSmooth) {
#pragma unroll
    for (int i = 0; i < kNvfp4Block; ++i) x[i] = __fsub_rn(x[i], mu[i]);
    amax = block_amax(x, kNvfp4Block);
  } else {
    const uint4 r[2] = {r0, r1};
    amax = bits_float(raw_amax_bits_of<kF16, kNvfp4Block>(r));
  }
  if (!(float_bits(amax) < kF32Inf)) {  // NaN or Inf: scale NaN, every byte NaN
    return make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  }
  const float a6 = kSmooth ? detail::div_rn(amax, kE2m1Max) : packed::div6_16bit(amax);
  uint32_t mag[2], sc;
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    const packed::FosCodes c = packed::four_over_six_codes(amax, a6, s_enc);
    const float2 e6 = table[c.c6], e4 = table[c.c4];
    if (packed::four_over_six_fast_ok(c)) {
      sc = packed::four_over_six_select<false>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
    } else {  // tiny or saturated /6 scale: rare (a warp diverges only where it occurs)
      sc = packed::four_over_six_select<true>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
    }
  } else {
    const float sf = fminf(detail::mul_rn(a6, s_enc), bits_float(detail::kFltMaxBits));
    sc = packed::e4m3_code_for_rule<kRule>(sf);
    const float inv = table[sc].x;  // code 0: 0, and the codes are all +0
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t t[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) t[i] = packed::e2m1_mag_term(detail::mul_rn(x[8 * j + i], inv));
      mag[j] = packed::e2m1_pack8_magnitudes(t);
    }
  }
  uint32_t s[4];
  if constexpr (kSmooth) {
#pragma unroll
    for (int q = 0; q < 4; ++q) s[q] = operand_fast::sign_bytes4_f32(x + 4 * q);
  } else {
    s[0] = operand_fast::sign_bytes4_16(r0.x, r0.y);
    s[1] = operand_fast::sign_bytes4_16(r0.z, r0.w);
    s[2] = operand_fast::sign_bytes4_16(r1.x, r1.y);
    s[3] = operand_fast::sign_bytes4_16(r1.z, r1.w);
  }
  const uint32_t smask = sc != 0 ? 0x80808080u : 0u;
  const uint2 row = __ldg(g_nv_fold + sc);
  uint4 o;
  operand_fast::fold8_mag(mag[0], row.x, row.y, s[0], s[1], smask, o.x, o.y);
  operand_fast::fold8_mag(mag[1], row.x, row.y, s[2], s[3], smask, o.z, o.w);
  return o;
}

// Register budget of nvfp4_operand_kernel as CTAs of kThreads per SM (the most ptxas fits without
// spills): Four-Over-Six 3 (80 registers), the single-candidate rules 4 (64). Occupancy is what
// keeps loads in flight here: every CTA of the bench streams its slice once.
template <Nvfp4ScaleRule kRule>
constexpr int nvfp4_operand_min_ctas() {
  if (kRule == Nvfp4ScaleRule::kFourOverSix) return 3;
  return 4;
}

// NVFP4 Q/K operands (nvfp4, nvfp4-hx, nvfp4-fast, nvfp4-all, fp4-direct): one 16-value block per
// thread and grid-stride step, several steps per thread (launch_nvfp4_operand sizes the grid), the
// next step's loads issued before this step's math. Per slice: the first loads, then the table
// from nvfp4_slice_setup_kernel into shared memory (its latency hidden behind the loads). A
// thread's block column is fixed (the stride is a multiple of d / 16): its addresses advance by
// fixed steps. Slices without a finite table
// (Nvfp4Slice::fast false) are left to nvfp4_operand_generic_kernel.
template <bool kF16, int kD, Nvfp4ScaleRule kRule, bool kSmooth>
__global__ void __launch_bounds__(kThreads, nvfp4_operand_min_ctas<kRule>())
    nvfp4_operand_kernel(XArgs a, const float* __restrict__ mean,
                         const Nvfp4Slice* __restrict__ slices, const float2* __restrict__ tables,
                         int64_t slice_step, void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kNb = kD / kNvfp4Block;
  static_assert(kThreads % kNb == 0);
  __shared__ float2 table[128];
  // kSmooth: the slice's channel means, read per block (16 registers fewer than keeping the
  // thread's 16 means live, which spilled at the 80-register budget).
  __shared__ __align__(16) float smean[kSmooth ? kD : 1];
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int blk = static_cast<int>(threadIdx.x % kNb);
  const int64_t u0 = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    const uint16_t* src = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h +
                          blk * kNvfp4Block + u0 / kNb * a.stride_s;
    const int64_t src_step = stride / kNb * a.stride_s;
    uint8_t* dst = static_cast<uint8_t*>(data) + bh * a.s * kD + u0 * kNvfp4Block;
    uint4 n0 = make_uint4(0, 0, 0, 0), n1 = n0;
    if (u0 < units) {
      n0 = __ldg(reinterpret_cast<const uint4*>(src));
      n1 = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    }
    const int64_t si = bh * slice_step;
    __syncthreads();  // the previous slice's table (and mean) reads are done
    if (threadIdx.x < 128) table[threadIdx.x] = __ldg(tables + si * 128 + threadIdx.x);
    if (kSmooth && threadIdx.x < kD) smean[threadIdx.x] = __ldg(mean + bh * kD + threadIdx.x);
    const float s_enc = __ldg(&slices[si].s_enc), factor = __ldg(&slices[si].factor);
    const bool fast = __ldg(&slices[si].fast) != 0u;
    __syncthreads();
    if (!fast) continue;
    for (int64_t u = u0; u < units; u += stride, src += src_step, dst += stride * kNvfp4Block) {
      const uint4 r0 = n0, r1 = n1;
      if (u + stride < units) {
        n0 = __ldg(reinterpret_cast<const uint4*>(src + src_step));
        n1 = __ldg(reinterpret_cast<const uint4*>(src + src_step) + 1);
      }
      float mu[kNvfp4Block];
#pragma unroll
      for (int i = 0; i < kNvfp4Block; ++i) mu[i] = kSmooth ? smean[blk * kNvfp4Block + i] : 0.f;
      *reinterpret_cast<uint4*>(dst) =
          nvfp4_operand_block<kF16, kRule, kSmooth>(r0, r1, mu, s_enc, table);
      if (u % (kOperandTileTokens * kNb) == 0) {
        scale[bh * tiles + u / kNb / kOperandTileTokens] = factor;
      }
    }
  }
}

// The slices without a finite table (a static s_enc beyond packed::nvfp4_table_finite, or a
// computed one from a tiny slice amax): every block by the reference functions. Launched only when
// such a slice can exist; the others return at once.
template <bool kF16, int kD, Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(kThreads)
    nvfp4_operand_generic_kernel(XArgs a, const float* __restrict__ mean,
                                 const Nvfp4Slice* __restrict__ slices, int64_t slice_step,
                                 void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kNb = kD / kNvfp4Block;
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    const Nvfp4Slice sl = slices[bh * slice_step];
    if (sl.fast != 0u) continue;
    for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < units;
         u += stride) {
      const int64_t token = u / kNb;
      const int blk = static_cast<int>(u % kNb);
      const uint4* p =
          reinterpret_cast<const uint4*>(row_chunk<kD, kNvfp4Block>(a, bh, token, blk));
      const float* mean_c = mean != nullptr ? mean + bh * kD + blk * kNvfp4Block : nullptr;
      *reinterpret_cast<uint4*>(static_cast<uint8_t*>(data) + (bh * a.s + token) * kD +
                                blk * kNvfp4Block) =
          nvfp4_fold_generic_raw<kF16, kRule>(__ldg(p), __ldg(p + 1), mean_c, sl.s_enc);
      if (blk == 0 && token % kOperandTileTokens == 0) {
        scale[bh * tiles + token / kOperandTileTokens] = sl.factor;
      }
    }
  }
}

}  // namespace fp4attn::detail::qk_operand
