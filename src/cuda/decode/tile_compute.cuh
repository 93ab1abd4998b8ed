// One 16-key tile of a warp's work in the paged decode, in both forms: the 16-row form
// (compute_tile: S = Q K^T, online softmax, O += P V, query rows as the MMA's M) and the
// transposed form for <= 8 rows (compute_tile_t: S^T = K Q^T, O^T += V^T P^T, keys and channels
// as the MMA's M). K and V are dequantized from the raw tile straight into MMA fragments.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/decode/config.h"
#include "cuda/decode/decode_bits.h"
#include "cuda/decode/dequant.cuh"
#include "cuda/decode/tile_loads.cuh"
#include "cuda/sm90/bf16x2.cuh"
#include "cuda/sm90/mma_sync.cuh"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::paged {

template <int D>
struct WarpState {
  float o[D / 8][4];
  float m[2], l[2];  // rows g, g + 8: running max (log2 units) and this lane's partial sum
};

template <int D, bool kFp4>
__device__ __forceinline__ void compute_tile(const RawTile<D, kFp4>& r,
                                             const uint32_t (&qa)[D / 16][4], int kt,
                                             const int (&vis)[2], float sl2, int t,
                                             WarpState<D>& st) {
  constexpr int kSteps = D / 16;
  float s[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
  }
  // S = Q K^T: per key half j (n-tile), k-steps from the lane's words.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if constexpr (kFp4) {
      const uint32_t sc = k_scale_pair<D>(r.ks[j]);
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        uint32_t w[4];
        k_words_nvfp4<D>(r.k[j][i], i, sc, w);
        sm90::mma_bf16_16816(s[j], qa[2 * i], w[0], w[1]);
        sm90::mma_bf16_16816(s[j], qa[2 * i + 1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        uint32_t lo, hi;
        k_words_fp8(r.k[j][ks], lo, hi);
        sm90::mma_bf16_16816(s[j], qa[ks], lo, hi);
      }
    }
  }
  // Scale, mask, online softmax (base 2). Element e of n-tile j: row g + 8 (e >> 1), key
  // kt + 8 j + 2 t + (e & 1).
  float corr[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kt + 8 * j + 2 * t + c;
        float& x = s[j][2 * rr + c];
        x = key < vis[rr] ? x * sl2 : -INFINITY;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
    const float m_new = fmaxf(st.m[rr], mx);
    const float ref = m_new == -INFINITY ? 0.f : m_new;
    // 1 when the max did not move, also for rows that see no key yet (-inf == -inf): the padding
    // rows of a block (12 of 16 at one token and 32/8) otherwise gave 0 and forced the O rescale
    // below on every tile (64 FMUL per tile, ~11% of the NVFP4 kernel's instructions in ncu).
    corr[rr] = st.m[rr] == m_new ? 1.f : sm90::fast_exp2(st.m[rr] - ref);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[j][2 * rr + c];
        x = sm90::fast_exp2(x - ref);
        sum += x;
      }
    }
    st.l[rr] = st.l[rr] * corr[rr] + sum;
    st.m[rr] = m_new;
  }
  if (__any_sync(0xFFFFFFFFu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      st.o[n][0] *= corr[0];
      st.o[n][1] *= corr[0];
      st.o[n][2] *= corr[1];
      st.o[n][3] *= corr[1];
    }
  }
  const uint32_t pa[4] = {sm90::pack_bf16x2(s[0][0], s[0][1]), sm90::pack_bf16x2(s[0][2], s[0][3]),
                          sm90::pack_bf16x2(s[1][0], s[1][1]), sm90::pack_bf16x2(s[1][2], s[1][3])};
  // O += P V: keys (2t, 2t+1) -> b0, (2t+8, 2t+9) -> b1; n-tile j = the lane group's channel j.
  if constexpr (kFp4) {
    uint32_t sc0, sc1;
    v_scale_pairs<D>(r, sc0, sc1);
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t b0[4], b1[4];
        v_words_nvfp4<D>(r, i, half, sc0, sc1, b0, b1);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          sm90::mma_bf16_16816(st.o[8 * i + 4 * half + q], pa, b0[q], b1[q]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t x[2], y[2];
        v_words_fp8<D>(r, i, half, x, y);
        sm90::mma_bf16_16816(st.o[4 * i + 2 * half], pa, x[0], x[1]);
        sm90::mma_bf16_16816(st.o[4 * i + 2 * half + 1], pa, y[0], y[1]);
      }
    }
  }
}

// ---- one tile, transposed form (<= 8 rows): S^T = K Q^T, online softmax, O^T += V^T P^T ---------

template <int D>
struct WarpStateT {
  float o[D / 16][4];  // M-tile i, element e: channel phys_ot(i, g + 8 (e >> 1)), row 2t + (e & 1)
  float m[2], l[2];    // rows 2t, 2t + 1: running max (log2 units), this lane's partial sum
};

template <int D, bool kFp4>
__device__ __forceinline__ void compute_tile_t(const RawTile<D, kFp4>& r,
                                               const uint32_t (&qb)[D / 16][2], int kt,
                                               const int (&vis)[2], float sl2, int g,
                                               WarpStateT<D>& st) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  // S^T: one MMA per k-step for both key slots (A rows g and g + 8), B = the lane's Q row g.
  if constexpr (kFp4) {
    uint32_t ksc[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) ksc[j] = k_scale_pair<D>(r.ks[j]);
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      uint32_t w[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) k_words_nvfp4<D>(r.k[j][i], i, ksc[j], w[j]);
      uint32_t a[4];
      kt_a_frag(w[0][0], w[0][1], w[1][0], w[1][1], a);
      sm90::mma_bf16_16816(s, a, qb[2 * i][0], qb[2 * i][1]);
      kt_a_frag(w[0][2], w[0][3], w[1][2], w[1][3], a);
      sm90::mma_bf16_16816(s, a, qb[2 * i + 1][0], qb[2 * i + 1][1]);
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t lo[2], hi[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) k_words_fp8(r.k[j][ks], lo[j], hi[j]);
      uint32_t a[4];
      kt_a_frag(lo[0], hi[0], lo[1], hi[1], a);
      sm90::mma_bf16_16816(s, a, qb[ks][0], qb[ks][1]);
    }
  }
  // Scale, mask, online softmax (base 2). Element e: key kt + g + 8 (e >> 1), row 2t + (e & 1);
  // a row's 16 keys live in the 8 lanes of one t (xor 4, 8, 16).
  float corr[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = kt + g + 8 * h;
      float& x = s[2 * h + rr];
      x = key < vis[rr] ? x * sl2 : -INFINITY;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 16));
    const float m_new = fmaxf(st.m[rr], mx);
    const float ref = m_new == -INFINITY ? 0.f : m_new;
    corr[rr] = st.m[rr] == m_new ? 1.f : sm90::fast_exp2(st.m[rr] - ref);
    float sum = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& x = s[2 * h + rr];
      x = sm90::fast_exp2(x - ref);
      sum += x;
    }
    st.l[rr] = st.l[rr] * corr[rr] + sum;
    st.m[rr] = m_new;
  }
  if (__any_sync(0xFFFFFFFFu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[i][e] *= corr[e & 1];
    }
  }
  // P^T as the B operand: keys 0..7 and 8..15 as two 8x8 BF16 matrices, transposed in registers.
  const uint32_t pb0 = sm90::movmatrix_trans(sm90::pack_bf16x2(s[0], s[1]));
  const uint32_t pb1 = sm90::movmatrix_trans(sm90::pack_bf16x2(s[2], s[3]));
  // O^T += V^T P^T: M-tile i = the 16-row form's n-tiles 2i, 2i + 1 (same dequantization).
  if constexpr (kFp4) {
    uint32_t sc0, sc1;
    v_scale_pairs<D>(r, sc0, sc1);
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t b0[4], b1[4];
        v_words_nvfp4<D>(r, i, half, sc0, sc1, b0, b1);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          // n-tiles 8i + 4 half + 2u + {0, 1}: M-tile 4i + 2 half + u.
          uint32_t a[4];
          vt_a_frag(b0[2 * u], b1[2 * u], b0[2 * u + 1], b1[2 * u + 1], a);
          sm90::mma_bf16_16816(st.o[4 * i + 2 * half + u], a, pb0, pb1);
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // n-tiles 4i + 2 half (x) and + 1 (y): M-tile 2i + half.
        uint32_t x[2], y[2], af[4];
        v_words_fp8<D>(r, i, half, x, y);
        vt_a_frag(x[0], x[1], y[0], y[1], af);
        sm90::mma_bf16_16816(st.o[2 * i + half], af, pb0, pb1);
      }
    }
  }
}

// ---- either form ------------------------------------------------------------------------------

// A warp's accumulators and softmax state in the kernel's form.
template <int D, bool kT>
using DecodeWarpState = std::conditional_t<kT, WarpStateT<D>, WarpState<D>>;

template <int D, bool kT>
__device__ __forceinline__ void init_warp_state(DecodeWarpState<D, kT>& st) {
  constexpr int kOTiles = kT ? D / 16 : D / 8;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[n][e] = 0.f;
  }
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
}

// One tile in the kernel's form.
template <int D, bool kFp4, bool kT>
__device__ __forceinline__ void compute_tile_as(const RawTile<D, kFp4>& r,
                                                const uint32_t (&qa)[D / 16][kQRegs<kT>], int kt,
                                                const int (&vis)[2], float sl2, int g, int t,
                                                DecodeWarpState<D, kT>& st) {
  if constexpr (kT) {
    compute_tile_t<D, kFp4>(r, qa, kt, vis, sl2, g, st);
  } else {
    compute_tile<D, kFp4>(r, qa, kt, vis, sl2, t, st);
  }
}

}  // namespace fp4attn::paged
