// The backward's main kernel (docs/kernels/bwd_sm90.md): one CTA of 4 warps per (key block of 64,
// batch, kv head), looping over the query heads of its GQA group and their blocks of 32 queries.
// Per query block, warp w owns keys 16w..16w+15 of the block:
//   S^T  = K Q^T       (E4M3 x E4M3)   -> P = exp2(S * c - LSE * log2 e), 0 where masked
//   dP^T = V dO_v^T    (E4M3 x E5M2)   -> dS = P * (dP * 2^-g' - D)
//   dV  += (2^8 P)^T dO_t   (E4M3 from registers x E5M2)
//   dK  += (2^h' dS q_scale)^T Q_t   (E4M3 from registers x E4M3)
//   dQ_acc[query block] += (2^h dS k_scale) K   (dS through shared memory; FP32 atomics, in
//                                                 key-block order when deterministic)
// kAmax: the same S, P, dP, dS but only the amax of dS * k_scale and dS * q_scale per
// (batch, head), which fixes h and h' before the gradient pass (numerics.md §8).
#pragma once

#include <cstdint>

#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_device.cuh"
#include "cuda/backward/bwd_params.h"
#include "cuda/backward/mma_fp8.cuh"

namespace fp4attn::bwd {

constexpr int kMainThreads = 128;

template <int D>
struct alignas(16) MainSmem {
  static constexpr int kRowPitch = D + 16;                // [token][channel]
  static constexpr int kKeyPitch = kBlockKeys + 16;       // [channel][key], [query][key]
  static constexpr int kQueryPitch = kBlockQueries + 16;  // [channel][query position]
  uint8_t k[kBlockKeys * kRowPitch];
  uint8_t v[kBlockKeys * kRowPitch];
  uint8_t kt[D * kKeyPitch];
  uint8_t q[kBlockQueries * kRowPitch];
  uint8_t dov[kBlockQueries * kRowPitch];
  uint8_t dot[D * kQueryPitch];
  uint8_t qt[D * kQueryPitch];
  uint8_t ds[kBlockQueries * kKeyPitch];
  float lse2[kBlockQueries];
  float dsum[kBlockQueries];
};

__device__ __forceinline__ void uint4_copy(uint8_t* dst, const uint8_t* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

// Deterministic dQ: the key block `n` adds its share of a query block only after key blocks
// 0..n-1 did (they are exactly the key blocks before it that touch the block: causal ranges are
// prefixes), and lower CTA indices are never waiting on higher ones.
__device__ __forceinline__ void wait_turn(const int* turn, int want) {
  if (threadIdx.x == 0) {
    int v;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
    } while (v != want);
  }
  __syncthreads();
}

__device__ __forceinline__ void pass_turn(int* turn) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(turn, 1);
}

// dK and dV of this key block, summed over the group, in the gradients' dtype: rows key0 and
// key0 + 8 of the accumulators.
template <int D>
__device__ __forceinline__ void store_kv_grads(const BwdParams& p, const float (&acc_dk)[D / 8][4],
                                               const float (&acc_dv)[D / 8][4], int u_dk, int u_dv,
                                               int bb, int hk, int key0, int t) {
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = key0 + 8 * (e / 2);
      const int c = nb * 8 + 2 * t + (e % 2);
      if (key < p.s_k) {
        store_grad(p.dk, bb * p.dk_stride[0] + key * p.dk_stride[1] + hk * p.dk_stride[2] + c,
                   p.dk_f32, mul_pow2(acc_dk[nb][e], u_dk) * p.softmax_scale);
        store_grad(p.dv, bb * p.dv_stride[0] + key * p.dv_stride[1] + hk * p.dv_stride[2] + c,
                   p.dv_f32, mul_pow2(acc_dv[nb][e], u_dv));
      }
    }
  }
}

template <int D, bool kAmax>
__global__ void __launch_bounds__(kMainThreads) bwd_main_kernel(BwdParams p) {
  using Smem = MainSmem<D>;
  constexpr int kRowP = Smem::kRowPitch, kKeyP = Smem::kKeyPitch, kQP = Smem::kQueryPitch;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n = int(blockIdx.x % unsigned(p.key_blocks));
  const int bhk = int(blockIdx.x / unsigned(p.key_blocks));  // batch * h_kv + kv head
  const int bb = bhk / p.h_kv, hk = bhk % p.h_kv;
  const int n0 = n * kBlockKeys;
  const int group = p.h / p.h_kv;

  // K rows (zero past s_k), K^T, and V un-permuted into [key][channel], once per CTA.
  const uint8_t* kg = p.k + int64_t(bhk) * p.s_k * D;
  for (int idx = tid; idx < kBlockKeys * D / 16; idx += kMainThreads) {
    const int r = idx / (D / 16), c16 = (idx % (D / 16)) * 16;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (n0 + r < p.s_k) w = *reinterpret_cast<const uint4*>(kg + int64_t(n0 + r) * D + c16);
    *reinterpret_cast<uint4*>(&sm.k[r * kRowP + c16]) = w;
    if (!kAmax) {
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        sm.kt[(c16 + e) * kKeyP + r] = uint8_t(words[e / 4] >> (8 * (e % 4)));
      }
    }
  }
  const uint8_t* vg = p.vt + int64_t(bhk) * D * p.vt_pitch;
  for (int idx = tid; idx < D * kBlockKeys / 4; idx += kMainThreads) {
    const int c = idx / (kBlockKeys / 4), pl = (idx % (kBlockKeys / 4)) * 4;
    uint32_t w = 0;
    if (n0 + pl < p.vt_pitch) {
      w = *reinterpret_cast<const uint32_t*>(vg + int64_t(c) * p.vt_pitch + n0 + pl);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sm.v[int(operand_v_key_at(pl + e)) * kRowP + c] = uint8_t(w >> (8 * e));
    }
  }
  const float ks = p.k_scale[int64_t(bhk) * ((p.s_k + 127) / 128) + n0 / 128];
  const int64_t q_tiles = (p.s_q + 127) / 128;
  const int mb_begin = int(first_query_block(n0, p.s_q, p.s_k, p.causal));
  const int mb_end = p.s_q_pad / kBlockQueries;

  float acc_dv[D / 8][4], acc_dk[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dv[j][e] = acc_dk[j][e] = 0.f;
  }
  int u_dv = 0, u_dk = 0;  // acc_dv * 2^u_dv is dV (acc_dk * 2^u_dk * softmax_scale is dK)

  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int64_t bh = int64_t(bb) * p.h + hq;
    const float* rec = p.amax + bh * kAmaxSlots;
    const int g_dp = pow2_scale_exp(rec[kAmaxDoFv], kE5m2Top);
    int h_dq = 0, h_dk = 0;
    if (!kAmax) {
      h_dq = pow2_scale_exp(rec[kAmaxDsK], kE4m3Top);
      h_dk = pow2_scale_exp(rec[kAmaxDsQ], kE4m3Top);
      // Each head's operands carry their own scales: bring the sums to this head's units
      // (a power of two: exact while in FP32 range).
      const int new_dv = -(kPLiftLog2 + pow2_scale_exp(rec[kAmaxDo], kE5m2Top)), new_dk = -h_dk;
      if (hq != hk * group) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc_dv[j][e] = mul_pow2(acc_dv[j][e], u_dv - new_dv);
            acc_dk[j][e] = mul_pow2(acc_dk[j][e], u_dk - new_dk);
          }
        }
      }
      u_dv = new_dv;
      u_dk = new_dk;
    }
    float m_k = 0.f, m_q = 0.f;  // kAmax: this thread's max |dS k_scale|, |dS q_scale|

    for (int mb = mb_begin; mb < mb_end; ++mb) {
      const int q0 = mb * kBlockQueries;
      __syncthreads();  // the previous block's tiles are no longer read
      for (int idx = tid; idx < kBlockQueries * D / 16; idx += kMainThreads) {
        const int r = idx / (D / 16), c16 = (idx % (D / 16)) * 16;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (q0 + r < p.s_q) {
          w = *reinterpret_cast<const uint4*>(p.q + (bh * p.s_q + q0 + r) * D + c16);
        }
        *reinterpret_cast<uint4*>(&sm.q[r * kRowP + c16]) = w;
        uint4_copy(&sm.dov[r * kRowP + c16], p.do_v + (bh * p.s_q_pad + q0 + r) * D + c16);
      }
      if (!kAmax) {
        for (int idx = tid; idx < D * (kBlockQueries / 16); idx += kMainThreads) {
          const int c = idx / (kBlockQueries / 16), h16 = (idx % (kBlockQueries / 16)) * 16;
          const int64_t off = (bh * D + c) * p.s_q_pad + q0 + h16;
          uint4_copy(&sm.dot[c * kQP + h16], p.do_t + off);
          uint4_copy(&sm.qt[c * kQP + h16], p.q_t + off);
        }
      }
      if (tid < kBlockQueries) {
        const int64_t i = q0 + tid;
        const bool in = i < p.s_q;
        sm.lse2[tid] =
            in ? p.lse[bb * p.lse_stride[0] + hq * p.lse_stride[1] + i] * 1.4426950408889634f
               : __int_as_float(0x7f800000);
        sm.dsum[tid] = in ? p.dsum[bh * p.s_q + i] : 0.f;
      }
      __syncthreads();

      const float qs = p.q_scale[bh * q_tiles + q0 / 128];
      const float zc = qs * ks * p.scale_log2;
      float s[4][4], dp[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
      }
      // Unrolled unless d = 128's gradient pass, where the dK/dV sums leave no room for it.
      constexpr int kUnrollK = (kAmax || D == 64) ? D / 32 : 1;
#pragma unroll kUnrollK
      for (int kk = 0; kk < D; kk += 32) {
        uint32_t ak[4], av[4];
        load_a(ak, sm.k, kRowP, warp * 16, kk);
        load_a(av, sm.v, kRowP, warp * 16, kk);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b0, b1;
          load_b(b0, b1, sm.q, kRowP, nt * 8, kk);
          mma_e4m3_e4m3(s[nt], ak, b0, b1);
          load_b(b0, b1, sm.dov, kRowP, nt * 8, kk);
          mma_e4m3_e5m2(dp[nt], av, b0, b1);
        }
      }

      // P and dS in the accumulator layout: element e of tile nt is key 16w + g + 8(e / 2),
      // query 8nt + 2t + e % 2 of the blocks.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rl = warp * 16 + g + 8 * (e / 2), cl = nt * 8 + 2 * t + (e % 2);
          const bool vis = key_visible(q0 + cl, n0 + rl, p.s_q, p.s_k, p.causal);
          const float pv = vis ? exp2f(fmaf(s[nt][e], zc, -sm.lse2[cl])) : 0.f;
          const float ds = vis ? pv * (mul_pow2(dp[nt][e], -g_dp) - sm.dsum[cl]) : 0.f;
          if (kAmax) {
            m_k = fmaxf(m_k, fabsf(ds * ks));
            m_q = fmaxf(m_q, fabsf(ds * qs));
          } else {
            s[nt][e] = pv * 256.f;  // 2^kPLiftLog2
            dp[nt][e] = mul_pow2(ds * qs, h_dk);
            sm.ds[cl * kKeyP + rl] = uint8_t(e4m3x2(mul_pow2(ds * ks, h_dq), 0.f));
          }
        }
      }
      if constexpr (kAmax) continue;

      {
        uint32_t ap[4], ad[4];
        accum_to_a(ap, s);
        accum_to_a(ad, dp);
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
          uint32_t b0, b1;
          load_b(b0, b1, sm.dot, kQP, nb * 8, 0);
          mma_e4m3_e5m2(acc_dv[nb], ap, b0, b1);
          load_b(b0, b1, sm.qt, kQP, nb * 8, 0);
          mma_e4m3_e4m3(acc_dk[nb], ad, b0, b1);
        }
      }
      __syncthreads();  // dS of every warp is in shared memory

      // dQ of this query block from this key block: warp w takes queries 16(w % 2).. and
      // channels (w / 2) * D/2 .., in two halves of D/4 channels (registers: the dK/dV sums
      // stay live throughout).
      constexpr int kNb = D / 32;
      const int mt = warp % 2;
      int* turn = p.dq_turn + bh * (p.s_q_pad / kBlockQueries) + mb;
      if (p.deterministic) wait_turn(turn, n);
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int nbase = (warp / 2) * 2 * kNb + half * kNb;
        float dq[kNb][4];
#pragma unroll
        for (int j = 0; j < kNb; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < kBlockKeys; kk += 32) {
          uint32_t a[4];
          load_a(a, sm.ds, kKeyP, mt * 16, kk);
#pragma unroll
          for (int j = 0; j < kNb; ++j) {
            uint32_t b0, b1;
            load_b(b0, b1, sm.kt, kKeyP, (nbase + j) * 8, kk);
            mma_e4m3_e4m3(dq[j], a, b0, b1);
          }
        }
#pragma unroll
        for (int j = 0; j < kNb; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t i = q0 + mt * 16 + g + 8 * (e / 2);
            const int c = (nbase + j) * 8 + 2 * t + (e % 2);
            if (i < p.s_q) atomicAdd(p.dq_acc + (bh * p.s_q + i) * D + c, dq[j][e]);
          }
        }
      }
      if (p.deterministic) pass_turn(turn);
    }

    if (kAmax) flush_ds_amax(p.amax + bh * kAmaxSlots, m_k, m_q);
  }
  if constexpr (!kAmax) {
    store_kv_grads<D>(p, acc_dk, acc_dv, u_dk, u_dv, bb, hk, n0 + warp * 16 + g, t);
  }
}

}  // namespace fp4attn::bwd
