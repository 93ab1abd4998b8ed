// The main kernel's producer (warp 0): per step (a query head of the GQA group and a block of
// 64 queries) Q and dO_v (and in the gradient pass dO_t and Q_t) by TMA, and the LSE / P row
// constants, D and the Q factor by plain loads, into the stage ring of MainSmem.
#pragma once

#include <cstdint>

#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/main_p.cuh"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::bwd {

// The (head, query block) steps' tiles into the stage ring. Every lane arrives on the full barrier
// after its row stores (kFullArrivals); lane 0's arrive also expects the TMA bytes.
template <int D, bool kDhp, int kP>
__device__ __forceinline__ void produce(const MainParams& P, MainSmem<D, kDhp>& sm, int bb, int hk,
                                        int mb_begin, int mb_end) {
  const BwdParams& p = P.p;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    sm90::prefetch_tensor_map(&P.tm_q);
    sm90::prefetch_tensor_map(&P.tm_dov);
    if constexpr (!kDhp) {
      sm90::prefetch_tensor_map(&P.tm_dot);
      sm90::prefetch_tensor_map(&P.tm_qt);
    }
  }
  constexpr uint32_t kBytes = (kDhp ? 2 : 4) * kQueryBlock * D;
  const int group = p.h / p.h_kv;
  int it = 0;
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int bh = bb * p.h + hq;
    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      constexpr int kStages = MainSmem<D, kDhp>::kStages;
      const int s = stage_of<kStages>(it);
      if (it >= kStages) sm90::mbar_wait(&sm.empty[s], parity_of<kStages>(it) ^ 1u);
      const int q0 = mb * kQueryBlock;
#pragma unroll
      for (int r = 0; r < kQueryBlock / 32; ++r) {
        const int il = r * 32 + lane;
        const int64_t i = q0 + il;
        const bool in = i < p.s_q;
        p_row_constants<kP>(p, bb, hq, i, in, &sm.lse2[s][il], &sm.pscale[s][il]);
        sm.dsum[s][il] = in ? p.dsum[int64_t(bh) * p.s_q + i] : 0.f;
      }
      if (lane == 0) {
        sm.q_scale[s] = p.q_scale[int64_t(bh) * ((p.s_q + 127) / 128) + q0 / 128];
        sm90::mbar_arrive_expect_tx(&sm.full[s], kBytes);
        sm90::tma_load_3d(sm.st[s].q, &P.tm_q, &sm.full[s], 0, q0, bh);
        sm90::tma_load_3d(sm.st[s].dov, &P.tm_dov, &sm.full[s], 0, q0, bh);
        if constexpr (!kDhp) {
          sm90::tma_load_3d(sm.st[s].dot, &P.tm_dot, &sm.full[s], q0, 0, bh);
          sm90::tma_load_3d(sm.st[s].qt, &P.tm_qt, &sm.full[s], q0, 0, bh);
        }
      } else {
        sm90::mbar_arrive(&sm.full[s]);
      }
    }
  }
}

}  // namespace fp4attn::bwd
