// The D_hp pass's consumer warpgroup (DSource::kHighPrecisionO): per step S^T and dP^T over the
// CTA's 128 keys, P rebuilt (main_p.cuh), and D_hp_i += sum_j p_ij dP_ij added into dsum_hp, in
// key-block turns when deterministic. The gradient pass then takes D_hp as its D.
#pragma once

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/main_p.cuh"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"
#include "cuda/sm90/wgmma_fp8.cuh"

namespace fp4attn::bwd {

// One reduce-scatter step over the 8 lanes sharing t (lane bits 2..4): of 2W partial sums, a lane
// keeps the half its lane bit `mask` selects, adding its partner's copy of that half.
template <int W>
__device__ __forceinline__ void halve(float (&v)[16], int lane, int mask) {
  const bool upper = (lane & mask) != 0;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float send = upper ? v[i] : v[i + W];
    const float keep = upper ? v[i + W] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
  }
}

// D_hp_i += sum over the CTA's 128 keys of p_ij dP_ij (the p
// and dP of dS: P masked, dP * 2^-g'; pv holds 2^8 p, the sum is scaled back exactly), one add per
// query row and CTA, from the warpgroup that ran the step (both tiles of 64 keys). Per thread, the
// two tiles' two row halves of each of its 16 columns; a reduce-scatter over the 8 lanes of each
// column leaves lane (g, t) the columns d_hp_col(g, t, 0 / 1) (bits.h, CPU-tested); the 4
// warps' sums meet in shared memory (the unused dS tile: per warpgroup, by the parity of its own
// step count, a buffer being rewritten two of its steps later, after its readers passed the
// barrier of the step between) and 64 threads add them in warp order. Deterministic: the adds of
// a query block in key-block order (turns on dsum_hp_turn).
template <int D>
__device__ __forceinline__ void add_d_hp(const BwdParams& p, MainSmem<D, true>& sm,
                                         const float (&pv)[2][32], const float (&dpu)[2][32],
                                         int local, int cw, int n, int64_t bh, int mb) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  float v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int e = d_hp_element(k);  // row half 0; e + 2: row half 1 of the same column
    v[k] = fmaf(pv[1][e + 2], dpu[1][e + 2],
                fmaf(pv[1][e], dpu[1][e], fmaf(pv[0][e + 2], dpu[0][e + 2], pv[0][e] * dpu[0][e])));
  }
  halve<8>(v, lane, 16);
  halve<4>(v, lane, 8);
  halve<2>(v, lane, 4);
  static_assert(sizeof(float) * 2 * 2 * 4 * kQueryBlock <= sizeof(MainSmem<D, true>::ds));
  auto red = reinterpret_cast<float(*)[2][4][kQueryBlock]>(&sm.ds[0][0]);
  *reinterpret_cast<float2*>(&red[cw][local & 1][warp][d_hp_col(g, t, 0)]) =
      make_float2(v[0], v[1]);
  wg_sync<kDsBarrier>(cw);
  int* turn =
      p.dsum_hp_turn != nullptr ? p.dsum_hp_turn + bh * (p.s_q_pad / kQueryBlock) + mb : nullptr;
  if (turn != nullptr) {
    if (tid == 0) wait_turn(turn, n);
    wg_sync<kDqBarrier>(cw);
  }
  const int i = mb * kQueryBlock + tid;
  if (tid < kQueryBlock && i < p.s_q) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) sum += red[cw][local & 1][w][tid];
    sum *= 1.f / float(1 << kPLiftLog2);  // pv is 2^8 p
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p.dsum_hp + bh * p.s_q + i), "f"(sum)
                 : "memory");
  }
  if (turn != nullptr) {
    __threadfence();
    wg_sync<kDqBarrier>(cw);
    if (tid == 0) atomicAdd(turn, 1);
  }
}

// D_hp pass, consumer warpgroup cw. The two warpgroups take alternate steps (cw: the steps it
// with it % 2 == cw), each over all 128 keys (two 64-key tiles), so that they run out of phase:
// one's element work under the other's wgmmas (in the gradient pass they share every step
// through dQ).
template <int D, int kP>
__device__ __forceinline__ void consume_dhp(const BwdParams& p, MainSmem<D, true>& sm, int cw,
                                            int bb, int hk, int n, int mb_begin, int mb_end) {
  constexpr int kStages = MainSmem<D, true>::kStages;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n0 = n * kKeyBlock;
  const int group = p.h / p.h_kv;
  const int bhk = bb * p.h_kv + hk;
  const float ks = p.k_scale[int64_t(bhk) * ((p.s_k + 127) / 128) + n];
  const uint64_t desc_k[2] = {sm90::make_kmajor_desc(sm.k, D),
                              sm90::make_kmajor_desc(sm.k + 64 * D, D)};
  const uint64_t desc_v[2] = {sm90::make_kmajor_desc(sm.v, D),
                              sm90::make_kmajor_desc(sm.v + 64 * D, D)};
  int it = 0, local = 0;
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int64_t bh = int64_t(bb) * p.h + hq;
    const Pow2 dp_unit(-pow2_scale_exp(p.amax[bh * kAmaxSlots + kAmaxDoFv], kE5m2Top));
    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      if ((it & 1) != cw) continue;
      const int s = stage_of<kStages>(it);
      const int q0 = mb * kQueryBlock;
      const uint64_t desc_q = sm90::make_kmajor_desc(sm.st[s].q, D);
      const uint64_t desc_dov = sm90::make_kmajor_desc(sm.st[s].dov, D);
      float sc[2][32], dp[2][32];
      sm90::mbar_wait(&sm.full[s], parity_of<kStages>(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int r = 0; r < 2; ++r) gemm_ss<64, false, D / 32>(sc[r], desc_k[r], desc_q);
      sm90::wgmma_commit();
#pragma unroll
      for (int r = 0; r < 2; ++r) gemm_ss<64, true, D / 32>(dp[r], desc_v[r], desc_dov);
      sm90::wgmma_commit();

      const float qs = sm.q_scale[s];
      const StepMask mask[2] = {step_mask(p, n0 + warp * 16 + g, q0),
                                step_mask(p, n0 + 64 + warp * 16 + g, q0)};
      sm90::wgmma_wait<1>();
      reg_fence(sc[0]);
      reg_fence(sc[1]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        p_step<kP>(sc[r], mask[r], sm.lse2[s], sm.pscale[s], score_factor<kP>(qs, ks, p.scale_log2),
                   t, direct_pair(sm, cw, 2 * (local & 1) + r));
      }
      reg_fence(sc[0]);  // P is computed here, while the dP^T wgmmas run, not after their wait
      reg_fence(sc[1]);
      sm90::wgmma_wait<0>();
      reg_fence(dp[0]);
      reg_fence(dp[1]);
      // dP as D_hp sees it (2^-g' undone).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (dp_unit.single()) {
#pragma unroll
          for (int e = 0; e < 32; ++e) dp[r][e] = dp_unit.apply<true>(dp[r][e]);
        } else {
#pragma unroll
          for (int e = 0; e < 32; ++e) dp[r][e] = dp_unit.apply<false>(dp[r][e]);
        }
      }
      // The stage (tiles, LSE, D) is no longer read by this thread: every thread of the
      // warpgroup that ran the step arrives (empty_arrivals), each releasing its own loads.
      sm90::mbar_arrive(&sm.empty[s]);
      // A uniform branch: the pass runs only with dsum_hp set (launch.cu).
      if (p.dsum_hp != nullptr) add_d_hp<D>(p, sm, sc, dp, local, cw, n, bh, mb);
      ++local;
    }
  }
}

}  // namespace fp4attn::bwd
