// The Hopper forward kernel, fp8 recipe (docs/kernels/fwd_sm90.md has the design and budgets).
//
// One CTA computes 128 query rows of one (batch, head): warpgroup 0 loads Q once and streams
// N-key K / V^T tiles through a kStages-deep TMA pipeline; warpgroups 1 and 2 each own 64 rows
// and run S = Q K^T (wgmma, both operands in shared memory), the exp2 softmax against an integer
// log2 running max (every rescale an exact power of two, numerics.md §4), P as E4M3 in
// registers, and O += P V (wgmma, A from registers). Each warpgroup issues the S GEMM of block j
// together with the PV GEMM of block j - 1, so that its softmax overlaps its own PV GEMM, and the
// two warpgroups take turns issuing, so that one's softmax overlaps the other's GEMMs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/attention/fwd_params.h"
#include "cuda/attention/p_paths.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/wgmma_fp8.cuh"

namespace fp4attn::sm90 {

// Experiment (off by default, see docs/kernels/fwd_sm90.md): the row sums of P come from the PV
// MMA through 8 rows of ones appended to each V^T box (N = d + 8), instead of one FADD per score
// element. They are then sums of the ROUNDED P, a different denominator from the golden fp8
// recipe's unrounded one (measured on the golden model: equal or better accuracy).
#ifndef FP4ATTN_FWD_ONES_SUM
#define FP4ATTN_FWD_ONES_SUM 0
#endif
// The code map's denominator is the sum of the rounded P, which the ones block computes.
template <int PM>
constexpr bool ones_sum() {
  return PM == kPCodes || (PM == kPExp2 && FP4ATTN_FWD_ONES_SUM != 0);
}
template <int PM>
constexpr int ones_bytes() {
  return ones_sum<PM>() ? 8 * 128 : 0;  // 8 rows of 128 keys of E4M3 1.0 per V^T box
}

// Keys per pipeline stage (N, a template parameter): 128 at d = 128, where a 64 x 256 S does not
// fit the registers beside O and P. At d = 64 both (scripts/fwd-variants,
// docs/kernels/fwd_sm90.md): 256 halves the per-block overhead (27% faster non-causal at s =
// 4096-16384), 128 wastes less past the causal diagonal (5-35% faster causal at s <= 4096);
// fwd_wide_block() picks. 256 spills 76 bytes in the persistent loop, which costs less than it
// saves.
constexpr int kNarrowN = 128;
constexpr int kWideN = 256;
inline bool fwd_wide_block(int d, bool causal, int64_t s_k) {
  return d == 64 && (!causal || s_k >= 8192);
}

template <int D, int PM, int N>
struct alignas(1024) FwdSmem {
  uint8_t q[kBlockM * D];
  uint8_t k[kStages][N * D];
  uint8_t v[kStages][N / kScaleTile][D * kScaleTile + ones_bytes<PM>()];  // V^T in 128-key boxes
  // Output staging per consumer warpgroup: D / 64 boxes of 64 rows x 128 bytes, 128-byte swizzle.
  uint8_t out[2][64 * D * 2];
  uint64_t q_full;
  uint64_t q_empty;  // both consumer warpgroups are done reading Q
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

template <int D, int PM, int N>
constexpr int fwd_smem_bytes() {
  return sizeof(FwdSmem<D, PM, N>) + 1024;  // + slack to align the dynamic base to 1024
}

// Keys the CTA's rows may see: [0, n_blocks * N).
template <int N>
__device__ __forceinline__ int key_blocks(const FwdParams& p, int m0) {
  int n_blocks = (p.s_k + N - 1) / N;
  if (p.causal) {
    const int last_row = min(p.s_q, m0 + kBlockM) - 1;
    const int last_key = last_row + p.s_k - p.s_q;  // bottom-right aligned
    n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / N + 1);
  }
  return n_blocks;
}

// Persistent schedule: CTA c takes tiles c, c + gridDim.x, ... Non-causal tiles go head by head
// (the CTAs running together share K/V in L2); causal tiles go longest first (largest m_tile of
// every head, then the next), so that the last wave is short work.
struct Tile {
  int m_tile, head, batch;
};

__device__ __forceinline__ int num_tiles(const FwdParams& p) { return p.m_tiles * p.b * p.h; }

__device__ __forceinline__ Tile tile_at(const FwdParams& p, int t) {
  const int bh_count = p.b * p.h;
  int m_tile, bh;
  if (p.causal) {
    m_tile = p.m_tiles - 1 - t / bh_count;
    bh = t % bh_count;
  } else {
    m_tile = t % p.m_tiles;
    bh = t / p.m_tiles;
  }
  return {m_tile, bh % p.h, bh / p.h};
}

// Position in the K/V stage ring: blocks are numbered across all tiles of the CTA.
struct Ring {
  int it = 0;
  __device__ __forceinline__ int stage(int j) const { return (it + j) % kStages; }
  __device__ __forceinline__ uint32_t parity(int j) const { return ((it + j) / kStages) & 1; }
};

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
// Named barriers 3 and 4: one consumer warpgroup's epilogue staging.
constexpr int kEpilogueBarrier = 3;

template <int D, int SN>
__device__ __forceinline__ void issue_qk(float (&s)[SN], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) wgmma_ss<2 * SN>(s, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
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

// The production kernels record nothing; the P-dump test build (fwd_dump_p.cu) passes a Dump
// that writes each block's P operand bytes and running reference to global memory.
struct NoPDump {
  static constexpr bool kOn = false;
};

template <int D, int PM, int N, class Dump>
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
    uint32_t pa[kPSteps][4];
    float alpha[2], c[2];
    uint64_t dv[kPSteps / 4];
    mbar_wait(&sm.q_full, q_uses & 1);
    mbar_wait(&sm.full[ring.stage(0)], ring.parity(0));
    turn_begin();
    wgmma_fence();
    issue_qk<D, kSN>(s, desc_q, make_kmajor_desc(sm.k[ring.stage(0)], D));
    turn_end(false);
    score_factors(0, c);
    wgmma_wait<0>();
    fence_regs(s);
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
      issue_qk<D, kSN>(s, desc_q, make_kmajor_desc(sm.k[stage], D));
      issue_pv<D, kPSteps, kON>(o, pa, dv);
      turn_end(false);
      // S_j is ready while PV_{j-1} may still run: the softmax overlaps it.
      wgmma_wait<1>();
      fence_regs(s);
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

  // Epilogue: O / l * scale_v[channel]; rows without a valid key give O = 0, LSE = +inf.
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

template <int D, int PM, int N, class Dump>
__device__ void consume(const FwdParams& p, FwdSmem<D, PM, N>& sm, int cw, const Dump& dump) {
  Ring ring;
  int q_uses = 0;
  for (int t = blockIdx.x; t < num_tiles(p); t += gridDim.x) {
    const Tile tile = tile_at(p, t);
    const int n_blocks = key_blocks<N>(p, tile.m_tile * kBlockM);
    consume_tile<D, PM, N>(p, sm, cw, tile.batch, tile.head, tile.head / (p.h / p.h_kv),
                           tile.m_tile, n_blocks, ring, q_uses, dump);
    ring.it += n_blocks;
    q_uses += n_blocks > 0;
  }
  // The CTA's shared memory must outlive the last TMA store's reads.
  if (p.o_tma && threadIdx.x % 128 == 0) bulk_wait_read();
}

// The kernel body, shared by the production kernel and the P-dump kernel of the tests.
template <int D, int PM, int N, class Dump>
__device__ __forceinline__ void fwd_body(const FwdParams& p, const Dump& dump) {
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<FwdSmem<D, PM, N>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                   ~uintptr_t(1023));
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    mbar_init(&sm.q_empty, 8);  // one arrival per consumer warp
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 8);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  if constexpr (ones_sum<PM>()) {  // the ones rows after every V^T box, read by the PV wgmma
    constexpr int kOnesBytes = ones_bytes<PM>();
    for (int i = threadIdx.x; i < kStages * (N / kScaleTile) * kOnesBytes / 4; i += kThreads) {
      const int box = i / (kOnesBytes / 4), word = i % (kOnesBytes / 4);
      reinterpret_cast<uint32_t*>(sm.v[box / (N / kScaleTile)][box % (N / kScaleTile)] +
                                  D * kScaleTile)[word] = 0x38383838u;  // E4M3 1.0
    }
    fence_async_shared();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<24>();  // frees 128 x 144 registers: exactly what the consumers add
    if (threadIdx.x == 0) produce<D, PM, N>(p, sm);
  } else {
    setmaxnreg_inc<240>();
    consume<D, PM, N>(p, sm, wg - 1, dump);
  }
}

// Persistent: gridDim.x CTAs (at most one per SM) walk the tiles of tile_at().
template <int D, int PM, int N>
__global__ void __launch_bounds__(kThreads, 1) fwd_fp8_kernel(const __grid_constant__ FwdParams p) {
  fwd_body<D, PM, N>(p, NoPDump{});
}

}  // namespace fp4attn::sm90
