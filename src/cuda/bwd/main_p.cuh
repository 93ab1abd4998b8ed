// How the main kernel rebuilds P from S (the P modes of cuda/fwd/p_mode.h): the per-row
// constants the producer stages, the score factor, and per consumer step 2^8 p for the
// thread's accumulator elements: exp2 / codes per element (p_elements), fp4-direct through the
// 32-key block maxima (p_direct). The bits match the forward's P (p_gen.cuh).
#pragma once

#include <cmath>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/params.h"
#include "cuda/fwd/p_gen.cuh"
#include "cuda/fwd/p_mode.h"
#include "cuda/sm90/ptx.cuh"
#include "fp4attn/numerics/direct_p.h"

namespace fp4attn::bwd {

constexpr float kCodeMagic = 12582912.f;  // 1.5 2^23: integers in a float's low mantissa bits

// The per-query-row constants of P, which the producer writes into the stage (lse2, pscale).
// * exp2 recipes: `row` = LSE log2 e - 8 (+inf past s_q): exp2 of z minus it is 2^8 p, the P
//   operand's lift (kPLiftLog2); pscale is not used.
// The exp-free recipes take them from the forward's integer reference m and LSE (l = 2^(LSE
// log2 e - m) the denominator in units of 2^m). Rows past s_q or without keys get pscale 0, which
// zeroes their P, and a finite `row`.
// * nvfp4-fast (numerics.md §4): P is the E4M3 code c = clamp(RNE(8 (z - m)) + 120, 0, 120) over
//   the sum of the codes' values, so 2^8 p = value(c) 2^(m - LSE log2 e). `row` = the code bias
//   1.5 2^23 + 120 - 8 m (the FFMA lands c in the low mantissa bits, as the forward's), pscale =
//   2^(120 + m - LSE log2 e), whose 2^120 undoes the code's placement in p_elements.
// * fp4-direct (numerics.md §5): the P operand is E4M3(q 2^(e + 6)) with q the E2M1 code of its
//   32-key block (exponent e_B from the block's largest z - m), worth p = operand 2^-6 / 6 / l.
//   `row` = m itself, pscale = 2^(8 - 6 - log2 6 + m - LSE log2 e): 2^8 p = operand pscale.
template <int kP>
__device__ __forceinline__ void p_row_constants(const BwdParams& p, int bb, int hq, int64_t i,
                                                bool in, float* row, float* pscale) {
  if constexpr (kP == sm90::kPExp2) {
    *row = in ? fmaf(p.lse[bb * p.lse_stride[0] + hq * p.lse_stride[1] + i], 1.4426950408889634f,
                     -float(kPLiftLog2))
              : __int_as_float(0x7f800000);
  } else {
    static_assert(kP == sm90::kPCodes || kP == sm90::kPDirect);
    float m = -INFINITY, lse = INFINITY;
    if (in) {
      m = p.row_max[bb * p.row_max_stride[0] + hq * p.row_max_stride[1] + i];
      lse = p.lse[bb * p.lse_stride[0] + hq * p.lse_stride[1] + i];
    }
    const bool keys = m > -INFINITY && lse < INFINITY;
    constexpr float kUnitLog2 = kP == sm90::kPCodes ? 120.f : 2.f - kLog2Six;
    if constexpr (kP == sm90::kPCodes) {
      *row = keys ? kCodeMagic + 120.f - 8.f * m : kCodeMagic;
    } else {
      *row = keys ? m : 0.f;
    }
    *pscale = keys ? exp2f(kUnitLog2 + m - lse * 1.4426950408889634f) : 0.f;
  }
}

// The step's factor of the raw scores: z = S zc (exp2 recipes); for the codes 8 z and for
// fp4-direct z, with the product in the forward's order (q_scale scale_log2) k_scale, so that the
// codes are the forward's.
template <int kP>
__device__ __forceinline__ float score_factor(float qs, float ks, float scale_log2) {
  if constexpr (kP == sm90::kPCodes) return 8.f * ((qs * scale_log2) * ks);
  if constexpr (kP == sm90::kPDirect) return (qs * scale_log2) * ks;
  return qs * ks * scale_log2;
}

// P lifted, sc = 2^8 p, 0 where masked. exp2 recipes: exp2(S c - (LSE log2 e - 8)), MUFU.EX2
// alone (flush to zero below 2^-126, where the P operand and every dS byte are 0 anyway).
// sm90::kPCodes (nvfp4-fast, p_row_constants): the code c = max(RNE(S 8c + bias), 1.5 2^23) - 1.5
// 2^23; shifted left by 20 its bits are a float worth value(c) 2^-120 (exponent field c >> 3,
// mantissa (c & 7) << 20; codes below 8 land as FP32 subnormals, exact as E4M3's), and pscale
// restores 2^120 / l 2^(m + 8 - m). The FMUL must not flush subnormals (no -ftz here).
template <bool kMasked, int kP>
__device__ __forceinline__ void p_elements(float (&sc)[32], const StepMask& m, const float* lse2,
                                           const float* pscale, float zc, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 l = col_pair(lse2, j, t);
    float2 ps;
    if constexpr (kP == sm90::kPCodes) ps = col_pair(pscale, j, t);
#pragma unroll
    for (int e = 4 * j; e < 4 * j + 4; ++e) {
      float pv;
      if constexpr (kP == sm90::kPCodes) {
        const float code = fmaxf(fmaf(sc[e], zc, (e & 1) ? l.y : l.x), kCodeMagic);
        pv = __uint_as_float(__float_as_uint(code) << 20) * ((e & 1) ? ps.y : ps.x);
      } else {
        pv = sm90::fast_exp2(fmaf(sc[e], zc, -((e & 1) ? l.y : l.x)));
      }
      sc[e] = (!kMasked || m.visible(e, t)) ? pv : 0.f;
    }
  }
}

// fp4-direct (p_row_constants): a thread holds keys g, g + 8 of its warp's 16 (the S^T rows) for
// 16 query columns; a 32-key block is a warp pair's 32 keys. Its maxima per column: over the two
// rows, the 8 lanes of equal t (3 shuffles each), then the pair's other warp through `slab`
// (lanes with g = 0 write [warp][column], a 64-thread barrier, every thread reads its columns of
// both warps). Then per column the forward's direct_row (p_gen.cuh: exponent, unit, the FFMA.SAT
// constant) and per element direct_operand with the clamp at 6 (valid for every |m|): q 2^(e + 6)
// as the forward's operand, except blocks 14 binades below the row max, whose E4M3 rounding the
// forward's pack adds (P there is below 2^-14 of the row's largest). Masked keys: -inf for the
// maxima, P = 0.
struct DirectPair {
  float (*slab)[kQueryBlock];  // [4 warps][64 columns] of this step's buffer
  int bar;                     // the pair's barrier id
};
template <bool kMasked>
__device__ __forceinline__ void p_direct(float (&sc)[32], const StepMask& m, const float* m_row,
                                         const float* pscale, float c, int t,
                                         const DirectPair& pair) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if constexpr (kMasked) {
#pragma unroll
    for (int e = 0; e < 32; ++e) sc[e] = m.visible(e, t) ? sc[e] : -INFINITY;
  }
  float cm[16];  // column 8 (k / 2) + 2t + k % 2: elements 4 (k / 2) + k % 2 and + 2
#pragma unroll
  for (int k = 0; k < 16; ++k) cm[k] = fmaxf(sc[4 * (k / 2) + k % 2], sc[4 * (k / 2) + k % 2 + 2]);
#pragma unroll
  for (int x = 4; x < 32; x *= 2) {
#pragma unroll
    for (int k = 0; k < 16; ++k) cm[k] = fmaxf(cm[k], __shfl_xor_sync(0xffffffffu, cm[k], x));
  }
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(&pair.slab[warp][accum_col(4 * j, t)]) =
          make_float2(cm[2 * j], cm[2 * j + 1]);
    }
  }
  asm volatile("bar.sync %0, 64;" ::"r"(pair.bar) : "memory");
  const float ac8 = (kDirectA / 8) * c;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 mm = col_pair(m_row, j, t), ps = col_pair(pscale, j, t);
    // Both warps' maxima from shared memory: cm is dead after the barrier (registers are short).
    const float2 own = col_pair(pair.slab[warp], j, t);
    const float2 ob = col_pair(pair.slab[warp ^ 1], j, t);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float bmax = fmaxf(b ? own.y : own.x, b ? ob.y : ob.x);
      const sm90::DirectRow row = sm90::direct_row(bmax, c, b ? mm.y : mm.x);
      const DirectKeyMap km = direct_key_map(row.sc);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h + b;
        const float v = direct_operand<true>(fma_sat(sc[e], ac8, row.k08), km) * (b ? ps.y : ps.x);
        sc[e] = (!kMasked || m.visible(e, t)) ? v : 0.f;
      }
    }
  }
}

// 2^8 p of the step's 32 elements, by P mode, with the mask skipped on full steps.
template <int kP>
__device__ __forceinline__ void p_step(float (&sc)[32], const StepMask& m, const float* lse2,
                                       const float* pscale, float zc, int t,
                                       const DirectPair& pair) {
  if constexpr (kP == sm90::kPDirect) {
    if (m.full) {
      p_direct<false>(sc, m, lse2, pscale, zc, t, pair);
    } else {
      p_direct<true>(sc, m, lse2, pscale, zc, t, pair);
    }
  } else if (m.full) {
    p_elements<false, kP>(sc, m, lse2, pscale, zc, t);
  } else {
    p_elements<true, kP>(sc, m, lse2, pscale, zc, t);
  }
}

// The warp pair's slab buffer `buf` of warpgroup cw and its barrier (fp4-direct).
template <int D, bool kDhp>
__device__ __forceinline__ DirectPair direct_pair(MainSmem<D, kDhp>& sm, int cw, int buf) {
  const int warp = (threadIdx.x % 128) / 32;
  return {sm.dslab[cw][buf], kPairBarrier + 2 * cw + warp / 2};
}

}  // namespace fp4attn::bwd
