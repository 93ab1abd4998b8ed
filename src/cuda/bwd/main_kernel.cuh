// The backward's main kernel on FP8 wgmma (docs/kernels/bwd_sm90.md): its entry, which lays out
// shared memory, initializes the stage barriers, loads the CTA's K / V and hands the warps their
// roles. The numerics are the golden model's emulated backward (BackwardArithmetic::kEmulatedFp8,
// DsScales::kPerTile): P rebuilt as the forward's (main_p.cuh), power-of-two factors folded into
// one multiply per operand.
//
// One CTA of 384 threads per (key block of 128, batch, kv head), two passes of one template:
// * warp 0 produces (main_producer.cuh): per step (a query head of the GQA group and a block of
//   64 queries) Q, dO_v, dO_t and Q_t by TMA and the LSE / D rows and the Q factor by plain loads
//   into a ring of stage_count stages;
// * gradient pass (main_grad.cuh): consumer warpgroup cw (1 + cw) owns keys 64cw..64cw+63 of the
//   block and per step computes
//     S^T  = K Q^T      (ss, E4M3 x E4M3)  -> 2^8 P (exp2: exp2(S c - LSE log2 e + 8)), 0 if masked
//     dP^T = V dO_v^T   (ss, E4M3 x E5M2)  -> dS = P * (dP * 2^-g' - D)
//     dV  += (2^8 P)^T dO_t           (rs: P^T from the S^T accumulator, E4M3 x E5M2)
//     dK  += (2^h' dS q_scale)^T Q_t   (rs: dS^T from the dP^T accumulator, E4M3 x E4M3)
//     dQ_acc[query block][channels of cw] += (2^h dS k_scale) K   (ss over all 128 keys: both
//         warpgroups write their keys' dS bytes to shared memory first; the tile staged in
//         shared memory and added by TMA reduce-add from one thread per warpgroup, in key-block
//         order when deterministic: main_dq.cuh)
//   and stores its dK, dV after the last step (main_kv_io.cuh);
// * D_hp pass (kDhp, DSource::kHighPrecisionO only; main_dhp.cuh): S, P, dP and
//   D_hp = sum_j p_ij dP_ij, the two warpgroups on alternate steps.
#pragma once

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_dhp.cuh"
#include "cuda/bwd/main_grad.cuh"
#include "cuda/bwd/main_kv_io.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/main_producer.cuh"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::bwd {

// CTA blockIdx.x = (batch * h_kv + kv head) * key_blocks + key block; its query blocks start at
// the first that sees a key of the block (causal).
template <int D, bool kDhp, int kP>
__global__ void __launch_bounds__(kMainThreads, 1)
    bwd_main_kernel(const __grid_constant__ MainParams P) {
  const BwdParams& p = P.p;
  extern __shared__ uint8_t smem_raw[];
  // Aligned to 1024 (the 128-byte swizzle's period) by pointer arithmetic on the shared array, so
  // that the compiler keeps shared-memory instructions (a detour through an integer makes every
  // access generic).
  auto& sm = *reinterpret_cast<MainSmem<D, kDhp>*>(smem_raw +
                                                   ((1024u - sm90::smem_addr(smem_raw)) & 1023u));
  const int n = int(blockIdx.x % unsigned(p.key_blocks));
  const int bhk = int(blockIdx.x / unsigned(p.key_blocks));  // batch * h_kv + kv head
  const int bb = bhk / p.h_kv, hk = bhk % p.h_kv;
  const int n0 = n * kKeyBlock;
  const int mb_begin = int(first_query_block(n0, p.s_q, p.s_k, p.causal, kQueryBlock));
  const int mb_end = p.s_q_pad / kQueryBlock;

  if (threadIdx.x == 0) {
    for (int s = 0; s < MainSmem<D, kDhp>::kStages; ++s) {
      sm90::mbar_init(&sm.full[s], kFullArrivals);
      sm90::mbar_init(&sm.empty[s], empty_arrivals(kDhp));
    }
    sm90::fence_barrier_init();
  }
  load_kv<D, kDhp>(p, sm, bhk, n0);
  sm90::fence_async_shared();  // the generic-proxy tile writes, before wgmma reads them
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::setmaxnreg_dec<24>();
    if (threadIdx.x < 32) produce<D, kDhp, kP>(P, sm, bb, hk, mb_begin, mb_end);
  } else {
    sm90::setmaxnreg_inc<240>();
    if constexpr (kDhp) {
      consume_dhp<D, kP>(p, sm, wg - 1, bb, hk, n, mb_begin, mb_end);
    } else {
      consume_grad<D, kP>(p, &P.tm_dq, sm, wg - 1, bb, hk, n, mb_begin, mb_end);
    }
  }
}

}  // namespace fp4attn::bwd
