// The forward kernel's mainloop: the producer warp's TMA loads of Q and the K/V stages, and a
// consumer warpgroup's pipeline over one tile's key blocks (S = Q K^T, P, O += P V), with the two
// consumer warpgroups taking turns issuing their GEMMs; each tile ends in the epilogue.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/fwd/config.h"
#include "cuda/fwd/epilogue.cuh"
#include "cuda/fwd/p_gen.cuh"
#include "cuda/fwd/params.h"
#include "cuda/fwd/scheduler.cuh"
#include "cuda/sm90/ptx.cuh"
#include "cuda/sm90/wgmma_fp8.cuh"
#include "cuda/sm90/wgmma_s8.cuh"

namespace fp4attn::sm90 {

template <int D, int PM, int N>
__device__ void produce(const FwdParams& p, FwdSmem<D, PM, N>& sm) {
  prefetch_tensor_map(&p.tm_q);
  prefetch_tensor_map(&p.tm_k);
  prefetch_tensor_map(&p.tm_v);
  Ring ring;
  int q_loads = 0;
  for (int t = blockIdx.x; t < num_tiles(p); t += gridDim.x) {
    const Tile tile = tile_at(p, t);
    const int n_blocks = key_blocks<N>(p, tile.m_tile * kBlockM);
    if (n_blocks == 0) continue;
    const int bh = tile.batch * p.h + tile.head;
    const int bh_kv = tile.batch * p.h_kv + tile.head / (p.h / p.h_kv);
    if (q_loads > 0) mbar_wait(&sm.q_empty, (q_loads - 1) & 1);
    mbar_arrive_expect_tx(&sm.q_full, kBlockM * D);
    tma_load_3d(sm.q, &p.tm_q, &sm.q_full, 0, tile.m_tile * kBlockM, bh);
    ++q_loads;
    for (int j = 0; j < n_blocks; ++j) {
      const int stage = ring.stage(j);
      // The stage's previous use ended one ring round ago.
      if (ring.it + j >= kStages) mbar_wait(&sm.empty[stage], ring.parity(j) ^ 1);
      mbar_arrive_expect_tx(&sm.full[stage], 2 * N * D);
      tma_load_3d(sm.k[stage], &p.tm_k, &sm.full[stage], 0, j * N, bh_kv);
#pragma unroll
      for (int b = 0; b < N / kScaleTile; ++b) {
        tma_load_3d(sm.v[stage][b], &p.tm_v, &sm.full[stage], j * N + b * kScaleTile, 0, bh_kv);
      }
    }
    ring.it += n_blocks;
  }
}

// Named barriers 1 and 2: the two consumer warpgroups take turns issuing their GEMMs (barrier 0
// is __syncthreads).
constexpr int kTurnBarrier = 1;

// S = Q K^T over E4M3 operands into FP32, or INT8 operands into S32 (the int8 recipes).
template <int D, int SN, class Acc>
__device__ __forceinline__ void issue_qk(Acc (&s)[SN], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    if constexpr (std::is_same_v<Acc, uint32_t>) {
      wgmma_ss_s8<2 * SN>(s, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
    } else {
      wgmma_ss<2 * SN>(s, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
    }
  }
  wgmma_commit();
}

// O += P V over the block's keys; V^T arrives as 128-key boxes with their own descriptors.
template <int D, int PS, int ON>
__device__ __forceinline__ void issue_pv(float (&o)[ON], const uint32_t (&pa)[PS][4],
                                         const uint64_t (&desc_v)[PS / 4]) {
#pragma unroll
  for (int kk = 0; kk < PS; ++kk) {
    // O: d = 64 or 128 columns, + 8 ones columns on the row-sum paths (N = 72, 136).
    wgmma_rs<2 * ON>(o, pa[kk], desc_v[kk / 4] + 2 * (kk % 4), 1);
  }
  wgmma_commit();
}

// Consumer warpgroup cw's tile: its pipeline over the tile's n_blocks key blocks, then its
// epilogue. kS8: Q and K are INT8 (the int8 recipes). Dump: the P-dump hook of the tests (NoPDump
// in the library's kernels).
template <int D, int PM, int N, bool kS8, class Dump>
__device__ void consume_tile(const FwdParams& p, FwdSmem<D, PM, N>& sm, int cw, int batch, int head,
                             int kv_head, int m_tile, int n_blocks, const Ring& ring, int q_uses,
                             const Dump& dump) {
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int r0 = warp * 16 + lane / 4;
  const int m0 = m_tile * kBlockM;
  const int rows[2] = {m0 + cw * 64 + r0, m0 + cw * 64 + r0 + 8};
  const int bh = batch * p.h + head;
  const int bh_kv = batch * p.h_kv + kv_head;

  constexpr int kSN = N / 2;       // S registers per thread (64 x N accumulator)
  constexpr int kPSteps = N / 32;  // k32 steps of the PV GEMM
  // O registers per thread: the 64 x D accumulator, + 64 x 8 row sums of P with the ones block.
  constexpr bool kOnes = ones_sum<PM>();
  constexpr int kON = D / 2 + (kOnes ? 4 : 0);
  float o[kON];
#pragma unroll
  for (int i = 0; i < kON; ++i) o[i] = 0.f;
  RowState st;
  // The ones block's row sums, moved out of the accumulator after every PV GEMM: the FP8 MMA
  // adds with ~14 bits, so a sum grown over thousands of keys would lose the small terms
  // (measured: -6% at s_k = 4097). Per block (128 keys) the loss is below the golden bound.
  float ones_l[2] = {0.f, 0.f};
  auto move_ones_sums = [&] {
    if constexpr (kOnes) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) ones_l[h2] += o[D / 2 + 2 * h2];
#pragma unroll
      for (int i = D / 2; i < kON; ++i)
        o[i] *= 0.f;  // in place: a new zero register serialized the wgmmas (C7511)
    }
  };

  if (n_blocks > 0) {
    const float q_scale = p.q_scale[int64_t(bh) * p.m_tiles + m_tile] * p.scale_log2;
    const float* k_scale = p.k_scale + int64_t(bh_kv) * p.n_tiles;
    const Mask mask{p.s_k, p.s_k - p.s_q, p.causal != 0};
    const uint64_t desc_q = make_kmajor_desc(sm.q + cw * 64 * D, D);
    // Score factors of block j's 128-key tiles (the last may lie past s_k: masked).
    auto score_factors = [&](int j, float(&c)[2]) {
      constexpr int kTiles = N / kScaleTile;
      c[0] = q_scale * k_scale[kTiles * j];
      c[1] = q_scale * k_scale[min(kTiles * j + kTiles - 1, p.n_tiles - 1)];
    };
    auto v_descs = [&](int stage, uint64_t(&d)[kPSteps / 4]) {
#pragma unroll
      for (int b = 0; b < kPSteps / 4; ++b) d[b] = make_kmajor_desc(sm.v[stage][b], kScaleTile);
    };
    // Turns: phase 0 issues QK_0, phase j (1..n-1) QK_j and PV_{j-1}, phase n PV_{n-1}. The
    // second warpgroup opens the first turn and skips its last hand-over, so that every
    // barrier phase completes.
    const bool second = cw == 1;
    if (second) named_barrier_arrive(kTurnBarrier, 256);
    auto turn_begin = [&] { named_barrier_sync(kTurnBarrier + cw, 256); };
    auto turn_end = [&](bool last) {
      if (!(second && last)) named_barrier_arrive(kTurnBarrier + 1 - cw, 256);
    };
    auto edge_block = [&](int n0) {
      return n0 + N > p.s_k || (mask.causal && n0 + N - 1 > m0 + mask.causal_offset);
    };

    float s[kSN];
    // INT8 S accumulates in S32 registers; the FP32 path accumulates in s itself.
    uint32_t s_int[kS8 ? kSN : 1];
    auto issue_s = [&](uint64_t desc_k) {
      if constexpr (kS8) {
        issue_qk<D, kSN>(s_int, desc_q, desc_k);
      } else {
        issue_qk<D, kSN>(s, desc_q, desc_k);
      }
    };
    // After the S GEMM's wait: the scores as FP32 values in s (the INT8 sums over d <= 128 fit
    // in 2^21, so s32_bits_to_float is exact).
    auto scores_ready = [&] {
      if constexpr (kS8) {
        fence_regs(s_int);
#pragma unroll
        for (int i = 0; i < kSN; ++i) s[i] = s32_bits_to_float(s_int[i]);
      } else {
        fence_regs(s);
      }
    };
    uint32_t pa[kPSteps][4];
    float alpha[2], c[2];
    uint64_t dv[kPSteps / 4];
    mbar_wait(&sm.q_full, q_uses & 1);
    mbar_wait(&sm.full[ring.stage(0)], ring.parity(0));
    turn_begin();
    wgmma_fence();
    issue_s(make_kmajor_desc(sm.k[ring.stage(0)], D));
    turn_end(false);
    score_factors(0, c);
    wgmma_wait<0>();
    scores_ready();
    p_values<PM, kOnes>(s, st, c, edge_block(0), 0, t, rows, mask, alpha);
    pack<PM>(s, pa);
    if constexpr (Dump::kOn) dump.template block<N>(p, bh, rows, t, 0, pa, st.m);

    for (int j = 1; j < n_blocks; ++j) {
      const int stage = ring.stage(j);
      const int prev = ring.stage(j - 1);
      score_factors(j, c);  // loads issued before the waits: their latency hides there
      mbar_wait(&sm.full[stage], ring.parity(j));
      v_descs(prev, dv);
      turn_begin();
      wgmma_fence();
      issue_s(make_kmajor_desc(sm.k[stage], D));
      issue_pv<D, kPSteps, kON>(o, pa, dv);
      turn_end(false);
      // S_j is ready while PV_{j-1} may still run: the softmax overlaps it.
      wgmma_wait<1>();
      scores_ready();
      const int n0 = j * N;
      p_values<PM, kOnes>(s, st, c, edge_block(n0), n0, t, rows, mask, alpha);
      wgmma_wait<0>();
      fence_regs(o);
      for (auto& r : pa) fence_regs(r);
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.empty[prev]);
      move_ones_sums();
      // Lazy rescale: with an integer running max the factors are mostly exactly 1.
      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] *= alpha[Frag::half(i)];
        ones_l[0] *= alpha[0];
        ones_l[1] *= alpha[1];
      }
      pack<PM>(s, pa);
      if constexpr (Dump::kOn) dump.template block<N>(p, bh, rows, t, j, pa, st.m);
    }

    // Every S GEMM of the tile is done: the producer may load the next tile's Q.
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.q_empty);
    const int last = ring.stage(n_blocks - 1);
    v_descs(last, dv);
    turn_begin();
    wgmma_fence();
    issue_pv<D, kPSteps, kON>(o, pa, dv);
    turn_end(true);
    wgmma_wait<0>();
    fence_regs(o);
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[last]);
    move_ones_sums();
  }

  store_tile<D, PM, N>(p, sm, cw, batch, head, bh_kv, m0, r0, t, rows, o, st, ones_l);
}

}  // namespace fp4attn::sm90
