// The Hopper forward kernel, fp8 recipe (docs/kernels/fwd_sm90.md has the
// design and budgets).
//
// One CTA computes 128 query rows of one (batch, head): warpgroup 0 loads Q
// once and streams K / V^T tiles through a kStages-deep TMA pipeline;
// warpgroups 1 and 2 each own 64 rows and run S = Q K^T (wgmma, both operands
// in shared memory), the exp2 softmax against an integer log2 running max
// (every rescale an exact power of two, numerics.md §4), P as E4M3 in
// registers, and O_block = P V (wgmma, A from registers), promoted into an FP32
// O every block.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/attention/fwd_params.h"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/wgmma_fp8.cuh"

namespace fp4attn::sm90 {

// The FP8 P lift of numerics.md §4: P = 2^(z - m + 8) lands in (128, 256].
constexpr float kPLift = 8.f;

template <int D>
struct alignas(1024) FwdSmem {
  uint8_t q[kBlockM * D];
  uint8_t k[kStages][kBlockN * D];
  uint8_t v[kStages][D * kBlockN];
  uint64_t q_full;
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

template <int D>
constexpr int fwd_smem_bytes() {
  return sizeof(FwdSmem<D>) + 1024;  // + slack to align the dynamic base to 1024
}

// Keys the CTA's rows may see: [0, n_blocks * 128).
__device__ __forceinline__ int key_blocks(const FwdParams& p, int m0) {
  int n_blocks = p.n_tiles;
  if (p.causal) {
    const int last_row = min(p.s_q, m0 + kBlockM) - 1;
    const int last_key = last_row + p.s_k - p.s_q;  // bottom-right aligned
    n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / kBlockN + 1);
  }
  return n_blocks;
}

template <int D>
__device__ void produce(const FwdParams& p, FwdSmem<D>& sm, int bh, int bh_kv, int m0,
                        int n_blocks) {
  prefetch_tensor_map(&p.tm_q);
  prefetch_tensor_map(&p.tm_k);
  prefetch_tensor_map(&p.tm_v);
  mbar_arrive_expect_tx(&sm.q_full, kBlockM * D);
  tma_load_3d(sm.q, &p.tm_q, &sm.q_full, 0, m0, bh);
  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j % kStages;
    const int round = j / kStages;
    if (round > 0) mbar_wait(&sm.empty[stage], (round - 1) & 1);
    mbar_arrive_expect_tx(&sm.full[stage], 2 * kBlockN * D);
    tma_load_3d(sm.k[stage], &p.tm_k, &sm.full[stage], 0, j * kBlockN, bh_kv);
    tma_load_3d(sm.v[stage], &p.tm_v, &sm.full[stage], j * kBlockN, 0, bh_kv);
  }
}

// Per-thread view of the 64 x N FP32 accumulator of one warpgroup (wgmma layout): register
// i holds row r0 + 8 * ((i >> 1) & 1) and column 8 * (i >> 2) + 2 * t + (i & 1).
struct Frag {
  __device__ __forceinline__ static int col(int i, int t) { return 8 * (i >> 2) + 2 * t + (i & 1); }
  __device__ __forceinline__ static int half(int i) { return (i >> 1) & 1; }
};

// Named barriers 1 and 2: the two consumer warpgroups take turns issuing their GEMMs, so that
// one's softmax runs while the other's GEMMs use the tensor cores (barrier 0 is __syncthreads).
constexpr int kTurnBarrier = 1;

template <int D>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    wgmma_m64n128k32_ss(s, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
  }
  wgmma_commit();
}

template <int D>
__device__ __forceinline__ void issue_pv(float (&ob)[D / 2], const uint32_t (&pa)[4][4],
                                         uint64_t desc_v, bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (D == 128) {
      wgmma_m64n128k32_rs(ob, pa[kk], desc_v + 2 * kk, accumulate || kk > 0);
    } else {
      wgmma_m64n64k32_rs(ob, pa[kk], desc_v + 2 * kk, accumulate || kk > 0);
    }
  }
  wgmma_commit();
}

// Softmax state of the two rows a thread holds.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // integer log2 running max
  float l[2] = {0.f, 0.f};              // this thread's share of the unrounded P sums
};

__device__ __forceinline__ bool key_visible(int key, int row, int s_k, bool causal,
                                            int causal_offset) {
  return key < s_k && (!causal || key <= row + causal_offset);
}

// S (raw Q K^T sums) -> P = 2^(S * c + 8 - m) in place, with m the integer log2 running max
// (NaN-ignoring, as the golden model) and the unrounded row sums; returns the factors
// 2^(m_old - m_new) by which earlier partial outputs must be scaled. Keys outside the causal
// band or past s_k (`edge` blocks only) get P = 0.
__device__ __forceinline__ void softmax_block(float (&s)[64], RowState& st, float c, bool edge,
                                              int n0, int t, const int (&rows)[2], int s_k,
                                              bool causal, int causal_offset, float (&alpha)[2]) {
  if (edge) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int key = n0 + Frag::col(i, t);
      if (!key_visible(key, rows[Frag::half(i)], s_k, causal, causal_offset)) s[i] = -INFINITY;
    }
  }
  // Four partial maxima and sums per row: short dependency chains (the order of an FP32 sum
  // is free: the golden model's denominator is exact).
  float mp[2][4];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
#pragma unroll
    for (int a = 0; a < 4; ++a) mp[h2][a] = -INFINITY;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    float& m = mp[Frag::half(i)][(i >> 2) & 3];
    m = fmaxf(m, s[i]);
  }
  float mx[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    mx[h2] = fmaxf(fmaxf(mp[h2][0], mp[h2][1]), fmaxf(mp[h2][2], mp[h2][3]));
  }
  float bias[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffff, mx[h2], 1));
    mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffff, mx[h2], 2));
    // max(S) * c = max(S * c) for c >= 0; a NaN product (c = 0 on an all-masked row) is
    // ignored by fmaxf.
    const float m_new = fmaxf(st.m[h2], ceilf(mx[h2] * c));
    // A row with no valid key so far keeps m = -inf; use 0 so exp2 sees -inf, not NaN.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[h2] = fast_exp2(st.m[h2] - m_use);  // exact power of two (0 from -inf)
    st.m[h2] = m_new;
    bias[h2] = kPLift - m_use;
  }
  float sp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  if (edge) {  // masked keys give exactly 0, even where c is 0 or NaN (-inf * c is NaN then)
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int key = n0 + Frag::col(i, t);
      const float e = fast_exp2(fmaf(s[i], c, bias[Frag::half(i)]));
      s[i] = key_visible(key, rows[Frag::half(i)], s_k, causal, causal_offset) ? e : 0.f;
      sp[Frag::half(i)][(i >> 2) & 3] += s[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      s[i] = fast_exp2(fmaf(s[i], c, bias[Frag::half(i)]));
      sp[Frag::half(i)][(i >> 2) & 3] += s[i];
    }
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const float rs = (sp[h2][0] + sp[h2][1]) + (sp[h2][2] + sp[h2][3]);
    st.l[h2] = fmaf(st.l[h2], alpha[h2], rs);
  }
}

// P (FP32) -> E4M3 A-operand registers: register kk*4 + {0,1,2,3} = rows {r0, r0+8, r0, r0+8}
// x key positions {4t..4t+3, 16+4t..16+4t+3} of the 32-key step kk; the V^T operand stores
// keys in the matching order (operands.h).
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const float* g = s + 16 * kk;
    pa[kk][0] = pack_e4m3x4(g[0], g[1], g[4], g[5]);
    pa[kk][1] = pack_e4m3x4(g[2], g[3], g[6], g[7]);
    pa[kk][2] = pack_e4m3x4(g[8], g[9], g[12], g[13]);
    pa[kk][3] = pack_e4m3x4(g[10], g[11], g[14], g[15]);
  }
}

template <int D>
__device__ void consume(const FwdParams& p, FwdSmem<D>& sm, int cw, int batch, int head,
                        int kv_head, int m_tile, int n_blocks) {
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int r0 = warp * 16 + lane / 4;
  const int m0 = m_tile * kBlockM;
  const int rows[2] = {m0 + cw * 64 + r0, m0 + cw * 64 + r0 + 8};
  const int bh = batch * p.h + head;
  const int bh_kv = batch * p.h_kv + kv_head;

  constexpr int kON = D / 2;  // O registers per thread (64 x D accumulator)
  float o[kON];               // FP32 output, promoted from ob every p.promote_every blocks
#pragma unroll
  for (int i = 0; i < kON; ++i) o[i] = 0.f;
  RowState st;

  if (n_blocks > 0) {
    const float q_scale = p.q_scale[int64_t(bh) * p.m_tiles + m_tile];
    const float* k_scale = p.k_scale + int64_t(bh_kv) * p.n_tiles;
    const int causal_offset = p.s_k - p.s_q;
    const uint64_t desc_q = make_kmajor_desc(sm.q + cw * 64 * D, D);
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
      return n0 + kBlockN > p.s_k || (p.causal && n0 + kBlockN - 1 > m0 + causal_offset);
    };

    float s[64];
    float ob[kON];  // P V partial sums since the last promotion (FP8 MMA accumulation)
    uint32_t pa[4][4];
    float alpha[2];
    mbar_wait(&sm.q_full, 0);
    mbar_wait(&sm.full[0], 0);
    turn_begin();
    wgmma_fence();
    issue_qk<D>(s, desc_q, make_kmajor_desc(sm.k[0], D));
    turn_end(false);
    wgmma_wait<0>();
    fence_regs(s);
    softmax_block(s, st, q_scale * k_scale[0] * p.scale_log2, edge_block(0), 0, t, rows, p.s_k,
                  p.causal, causal_offset, alpha);
    pack_p(s, pa);
    int pending = 0;  // blocks accumulated in ob since the last promotion

    // The next block's K scale is loaded one block ahead: its latency stays off the softmax.
    float k_scale_next = k_scale[n_blocks > 1 ? 1 : 0];
    for (int j = 1; j < n_blocks; ++j) {
      const float k_scale_j = k_scale_next;
      k_scale_next = k_scale[j + 1 < n_blocks ? j + 1 : j];
      const int stage = j % kStages;
      const int prev = (j - 1) % kStages;
      mbar_wait(&sm.full[stage], (j / kStages) & 1);
      turn_begin();
      wgmma_fence();
      issue_qk<D>(s, desc_q, make_kmajor_desc(sm.k[stage], D));
      issue_pv<D>(ob, pa, make_kmajor_desc(sm.v[prev], kBlockN), pending > 0);
      turn_end(false);
      wgmma_wait<1>();
      fence_regs(s);
      const int n0 = j * kBlockN;
      softmax_block(s, st, q_scale * k_scale_j * p.scale_log2, edge_block(n0), n0, t, rows, p.s_k,
                    p.causal, causal_offset, alpha);
      wgmma_wait<0>();
      fence_regs(ob);
      for (auto& r : pa) fence_regs(r);
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.empty[prev]);
      ++pending;
      // Lazy rescale: with an integer running max the factors are mostly exactly 1.
      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int i = 0; i < kON; ++i) {
          o[i] *= alpha[Frag::half(i)];
          ob[i] *= alpha[Frag::half(i)];
        }
      }
      if (pending == p.promote_every) {
#pragma unroll
        for (int i = 0; i < kON; ++i) o[i] += ob[i];
        pending = 0;
      }
      pack_p(s, pa);
    }

    const int last = (n_blocks - 1) % kStages;
    turn_begin();
    wgmma_fence();
    issue_pv<D>(ob, pa, make_kmajor_desc(sm.v[last], kBlockN), pending > 0);
    turn_end(true);
    wgmma_wait<0>();
    fence_regs(ob);
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[last]);
#pragma unroll
    for (int i = 0; i < kON; ++i) o[i] += ob[i];
  }

  // Epilogue: O / l * scale_v[channel]; rows without a valid key give O = 0, LSE = +inf.
  float inv[2], lse[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float l = st.l[h2];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    const bool empty = l == 0.f;
    inv[h2] = empty ? 0.f : 1.f / l;
    lse[h2] = empty ? INFINITY : (st.m[h2] - kPLift + log2f(l)) * 0.69314718055994531f;
  }
  const float* v_scale = p.v_scale + int64_t(bh_kv) * D;
#pragma unroll
  for (int i = 0; i < kON; i += 2) {
    const int row = rows[Frag::half(i)];
    if (row >= p.s_q) continue;
    const int ch = Frag::col(i, t);
    const float f = inv[Frag::half(i)];
    const float v0 = o[i] * f * v_scale[ch];
    const float v1 = o[i + 1] * f * v_scale[ch + 1];
    const int64_t off = int64_t(batch) * p.o_stride_b + int64_t(row) * p.o_stride_s +
                        int64_t(head) * p.o_stride_h + ch;
    if (p.out_fp16) {
      *reinterpret_cast<__half2*>(static_cast<__half*>(p.o) + off) = __floats2half2_rn(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.o) + off) =
          __floats2bfloat162_rn(v0, v1);
    }
  }
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rows[h2] < p.s_q) p.lse[int64_t(bh) * p.s_q + rows[h2]] = lse[h2];
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) fwd_fp8_kernel(const __grid_constant__ FwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<FwdSmem<D>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                            ~uintptr_t(1023));
  const int wg = threadIdx.x / 128;
  // Causal: the longest query tiles first, so the tail of the grid is short
  // work.
  const int m_tile = p.causal ? p.m_tiles - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (p.h / p.h_kv);
  const int n_blocks = key_blocks(p, m_tile * kBlockM);

  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 8);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0 && n_blocks > 0) {
      produce<D>(p, sm, batch * p.h + head, batch * p.h_kv + kv_head, m_tile * kBlockM, n_blocks);
    }
  } else {
    setmaxnreg_inc<240>();
    consume<D>(p, sm, wg - 1, batch, head, kv_head, m_tile, n_blocks);
  }
}

}  // namespace fp4attn::sm90
