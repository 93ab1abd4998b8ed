// The gradient pass's consumer warpgroup: per step S^T and dP^T (wgmma ss), P rebuilt
// (main_p.cuh), dS and its per-tile scales, the FP8 operands of dV, dK (wgmma rs, accumulated in
// registers over the CTA's steps) and dQ (wgmma ss over the block's 128 keys, then main_dq.cuh's
// reduce), and after its last step dK, dV (main_kv_io.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/device.cuh"
#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_dq.cuh"
#include "cuda/bwd/main_kv_io.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/main_p.cuh"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"
#include "cuda/sm90/wgmma_fp8.cuh"

namespace fp4attn::bwd {

// The FP8 A operand (two k-steps of 32 queries) from a 64 x 64 accumulator (bits.h
// a_source_element): P^T or dS^T with no shuffle, against the permuted dO_t / Q_t.
__device__ __forceinline__ void pack_a(const float (&x)[32], uint32_t (&a)[2][4]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float* g = x + 16 * kk;
      a[kk][r] = sm90::pack_e4m3x4(g[a_source_element(r, 0)], g[a_source_element(r, 1)],
                                   g[a_source_element(r, 2)], g[a_source_element(r, 3)]);
    }
  }
}

// 2^8 dS = sc (dP 2^-g' - D) of the step's elements into dp (0 where masked; sc holds 2^8 p),
// and this thread's max |2^8 dS|. kSingle: dp_unit is one multiply.
template <bool kSingle, bool kMasked>
__device__ __forceinline__ float ds_elements(const float (&sc)[32], float (&dp)[32],
                                             const float* dsum, const Pow2& dp_unit,
                                             const StepMask& mask, int t) {
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 dd = col_pair(dsum, j, t);
#pragma unroll
    for (int e = 4 * j; e < 4 * j + 4; ++e) {
      const float dse = sc[e] * (dp_unit.apply<kSingle>(dp[e]) - ((e & 1) ? dd.y : dd.x));
      dp[e] = (!kMasked || mask.visible(e, t)) ? dse : 0.f;
      m = fmaxf(m, fabsf(dp[e]));
    }
  }
  return m;
}
__device__ __forceinline__ float ds_step(const float (&sc)[32], float (&dp)[32], const float* dsum,
                                         const Pow2& dp_unit, const StepMask& mask, int t) {
  if (dp_unit.single()) {
    return mask.full ? ds_elements<true, false>(sc, dp, dsum, dp_unit, mask, t)
                     : ds_elements<true, true>(sc, dp, dsum, dp_unit, mask, t);
  }
  return ds_elements<false, true>(sc, dp, dsum, dp_unit, mask, t);
}

// The tile's max |dS| over both warpgroups from each thread's max |2^8 dS| m: the 8 warps'
// maxima by step parity (rewritten two steps later, after every reader passed the next step's
// barriers). warp and lane come from the caller: recomputed here from threadIdx, the same code
// schedules differently in the fp4-direct kernels.
template <int D>
__device__ __forceinline__ float tile_max_ds(MainSmem<D, false>& sm, int it, int cw, int warp,
                                             int lane, float m) {
  m = warp_max(m);
  sm.tile_max[it & 1][cw * 4 + warp][lane] = m;  // every lane its own slot (no branch)
  asm volatile("bar.sync %0, %1;" ::"n"(kTileMaxBarrier), "n"(kConsumerThreads) : "memory");
  float tile = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) tile = fmaxf(tile, sm.tile_max[it & 1][w][lane]);
  return tile * (1.f / float(1 << kPLiftLog2));  // scaling by 2^-8 commutes with the max
}

// dK's exponent within a head: the running minimum e_head of the tiles' exponents (once a tile
// has dS), the sums dk scaled down to it (before this step's dK wgmma; the last one completed
// at the last step's wait). e_acc: dk's current exponent.
template <int D>
__device__ __forceinline__ void dk_exponent_step(float (&dk)[D / 2], float tile, float qs,
                                                 int& e_head, bool& e_head_set, int& e_acc) {
  if (tile > 0.f) {
    const int e = pow2_scale_exp(tile * qs, kE4m3Top);
    e_head = e_head_set ? min(e_head, e) : e;
    e_head_set = true;
    if (e_head != e_acc) {
      const Pow2 rk(e_head - e_acc);
#pragma unroll
      for (int i = 0; i < D / 2; ++i) dk[i] = rk(dk[i]);
      e_acc = e_head;
    }
  }
}

// The dS operands from dp = 2^8 dS: dK's (2^e_acc dS q_scale, packed later from dp) in place,
// dQ's (E4M3 of 2^h_dq dS k_scale) as bytes into the step's dS_k tile, element e's byte at
// ds_tile + ds_at[e % 2][row half] + 1024 (e / 4).
// The fast form folds 2^-8 into one factor per operand, fq = q_scale 2^(e_acc - 8) and fk =
// k_scale 2^(h_dq - 8) (exact: normal powers of two times normal scales), one multiply each; the
// general form (exponents or factors out of FP32's normal range: tiny or huge tiles) divides by
// 2^8 and applies Pow2. Both round the same real numbers once per operation.
__device__ __forceinline__ void ds_operands(float (&dp)[32], uint8_t* ds_tile,
                                            const uint32_t (&ds_at)[2][2], float qs, float ks,
                                            int e_acc, int h_dq) {
  const Pow2 to_dk8(e_acc - kPLiftLog2), to_dq8(h_dq - kPLiftLog2);
  const float fq = to_dk8.apply<true>(qs), fk = to_dq8.apply<true>(ks);
  auto normal = [](float x) { return x >= 1.17549435e-38f && x <= 3.4e38f; };
  const bool fast = to_dk8.single() && to_dq8.single() && normal(fq) && normal(fk);
  const Pow2 to_dk(e_acc), to_dq(h_dq);
  auto quant = [&](auto fast_form) {
    constexpr bool kFast = decltype(fast_form)::value;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float bq[4];  // the dS_k values of elements 4j..4j + 3
#pragma unroll
      for (int e = 4 * j; e < 4 * j + 4; ++e) {
        const float ds = dp[e];
        if constexpr (kFast) {
          dp[e] = ds * fq;
          bq[e - 4 * j] = ds * fk;
        } else {
          const float d1 = ds * (1.f / float(1 << kPLiftLog2));
          dp[e] = to_dk.apply<false>(d1 * qs);
          bq[e - 4 * j] = to_dq.apply<false>(d1 * ks);
        }
      }
      // Elements 4j, 4j + 1 (row half 0) and 4j + 2, 4j + 3 (row half 1): one conversion per
      // pair, the two bytes to their query rows.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t pair = sm90::pack_e4m3x2(bq[2 * h], bq[2 * h + 1]);
        uint8_t* row = ds_tile + 1024 * j;
        row[ds_at[0][h]] = uint8_t(pair);
        row[ds_at[1][h]] = uint8_t(pair >> 8);
      }
    }
  };
  if (fast) {
    quant(std::true_type{});
  } else {
    quant(std::false_type{});
  }
}

// Gradient pass, consumer warpgroup cw (0, 1): keys n0 + 64cw.. of the block.
template <int D, int kP>
__device__ __forceinline__ void consume_grad(const BwdParams& p, const CUtensorMap* tm_dq,
                                             MainSmem<D, false>& sm, int cw, int bb, int hk, int n,
                                             int mb_begin, int mb_end) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n0 = n * kKeyBlock;
  const int key_l = cw * 64 + warp * 16 + g;  // block-local key of this thread's first row
  const int group = p.h / p.h_kv;
  const int bhk = bb * p.h_kv + hk;
  const float ks = p.k_scale[int64_t(bhk) * ((p.s_k + 127) / 128) + n];
  const uint64_t desc_k = sm90::make_kmajor_desc(sm.k + cw * 64 * D, D);
  const uint64_t desc_v = sm90::make_kmajor_desc(sm.v + cw * 64 * D, D);
  const uint64_t desc_kt = sm90::make_kmajor_desc(sm.kt + cw * (D / 2) * kKeyBlock, kKeyBlock);

  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.f;
  // dv 2^u_dv(hq) is dV while head hq's steps add to it: recomputed from the (read-only here)
  // amax record where needed rather than carried, a register fewer across the step loop.
  auto u_dv = [&](int hq) {
    return -(kPLiftLog2 +
             pow2_scale_exp(p.amax[(int64_t(bb) * p.h + hq) * kAmaxSlots + kAmaxDo], kE5m2Top));
  };
  // dS's scales per tile (golden DsScales::kPerTile, numerics.md §8): dk * 2^-e_acc *
  // softmax_scale is dK; within a head the exponent of dK's dS operand is the running minimum of
  // the tiles' exponents (e_head), and the sums are scaled to it before each dK wgmma.
  int e_acc = 0;
  int it = 0;

  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int64_t bh = int64_t(bb) * p.h + hq;
    const float* rec = p.amax + bh * kAmaxSlots;
    const int g_dp = pow2_scale_exp(rec[kAmaxDoFv], kE5m2Top);
    // Each head's dO carries its own scale: bring dV's sums to this head's units (a power of two:
    // exact while in FP32 range). No wgmma is in flight here.
    if (hq != hk * group) {
      const Pow2 rv(u_dv(hq - 1) - u_dv(hq));
#pragma unroll
      for (int i = 0; i < D / 2; ++i) dv[i] = rv(dv[i]);
    }
    // mul_pow2 by this head's exponent, branch-free (Pow2 in bits.h: the same bits).
    const Pow2 dp_unit(-g_dp);
    bool e_head_set = false;  // the head's running exponent of dK's operand, once a tile has dS
    int e_head = 0;

    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      constexpr int kStages = MainSmem<D, false>::kStages;
      const int s = stage_of<kStages>(it);
      const int q0 = mb * kQueryBlock;
      const uint64_t desc_q = sm90::make_kmajor_desc(sm.st[s].q, D);
      const uint64_t desc_dov = sm90::make_kmajor_desc(sm.st[s].dov, D);
      float sc[32], dp[32];
      sm90::mbar_wait(&sm.full[s], parity_of<kStages>(it));
      const float qs = sm.q_scale[s];  // the producer's copy: no global load on this path
      const float zc = score_factor<kP>(qs, ks, p.scale_log2);
      sm90::wgmma_fence();
      gemm_ss<64, false, D / 32>(sc, desc_k, desc_q);
      sm90::wgmma_commit();
      gemm_ss<64, true, D / 32>(dp, desc_v, desc_dov);
      sm90::wgmma_commit();

      const StepMask mask = step_mask(p, n0 + key_l, q0);
      const float* dsum = sm.dsum[s];
      sm90::wgmma_wait<1>();
      reg_fence(sc);
      p_step<kP>(sc, mask, sm.lse2[s], sm.pscale[s], zc, t, direct_pair(sm, cw, it & 1));
      reg_fence(sc);  // P is computed here, while the dP^T wgmmas run, not after their wait
      sm90::wgmma_wait<0>();
      reg_fence(dp);
      const float m = ds_step(sc, dp, dsum, dp_unit, mask, t);
      const float tile = tile_max_ds<D>(sm, it, cw, warp, lane, m);
      // dQ's exponent: the tile's own; dK's: the head's running minimum.
      const int h_dq = pow2_scale_exp(tile * ks, kE4m3Top);
      dk_exponent_step<D>(dk, tile, qs, e_head, e_head_set, e_acc);
      // dS_k bytes of element e at ds_at[e % 2][row half] + 1024 (e / 4): query row
      // 8 (e / 4) + 2t + e % 2, key column key_l + 8 h, swizzled (row % 8 = 2t + e % 2). Formed
      // here rather than in ds_operands: the same code, but ptxas then schedules the step
      // differently.
      uint8_t* ds_tile = sm.ds[it & 1];
      uint32_t ds_at[2][2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ds_at[b][h] = swizzle_offset(2 * t + b, key_l + 8 * h, kKeyBlock);
        }
      }
      ds_operands(dp, ds_tile, ds_at, qs, ks, e_acc, h_dq);
      uint32_t pa[2][4], da[2][4];
      pack_a(sc, pa);
      pack_a(dp, da);
      const uint64_t desc_dot = sm90::make_kmajor_desc(sm.st[s].dot, kQueryBlock);
      const uint64_t desc_qt = sm90::make_kmajor_desc(sm.st[s].qt, kQueryBlock);
      sm90::wgmma_fence();
      gemm_rs<D, true>(dv, pa, desc_dot);
      gemm_rs<D, false>(dk, da, desc_qt);
      sm90::wgmma_commit();

      float dq[D / 4];
      issue_dq_gemm<D>(dq, ds_tile, desc_kt);
      sm90::wgmma_wait<0>();
      reg_fence(dv);
      reg_fence(dk);
      reg_fence(dq);
      reg_fence(pa);
      reg_fence(da);
      sm90::mbar_arrive(&sm.empty[s]);  // every consumer thread: its own loads (kEmptyArrivals)
      add_dq<D>(p, tm_dq, sm, dq, h_dq, it, cw, n, bh, mb);
    }
  }
  if (tid == 0) bulk_wait_all();  // the staging reads, before the CTA ends
  const int last = (hk + 1) * group - 1;
  store_kv<D>(p, dk, dv, -e_acc, u_dv(last), bb, hk, n0 + key_l, t);
}

}  // namespace fp4attn::bwd
