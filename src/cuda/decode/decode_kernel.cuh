// The paged decode kernel (paged_attention_cuda.h; docs/kernels/decode.md has the design and the
// instruction budget). One CTA of 4 warps per (split, kv head, row block, sequence); a row block
// is up to 16 query rows (group heads x tokens) sharing one kv head, the M of mma.m16n8k16 (BF16
// in, FP32 accumulate), or up to 8 rows as its N in the transposed form. Each warp takes every
// 4th 16-key tile of the CTA's key range (NVFP4 through its shared-memory ring, FP8 straight into
// registers), dequantizes K and V into MMA fragments, keeps its own online softmax, and the warps
// merge through shared memory at the end. With split-KV and counters the last CTA of a group to
// finish merges the group's splits (the fused combine).
//
// Fragment maps (lane = 4 g + t): the S = Q K^T MMA's k index is a permutation of the channels
// chosen so that lane t of key g reads one contiguous chunk of the key's packed row (phys_k_* in
// decode_bits.h), and Q is loaded with the same permutation; the P V MMA's n index is permuted so
// that lane group g owns channels [g d/8, (g + 1) d/8) (n-tile j <-> channel g d/8 + j), its 4
// keys' chunks.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/decode/combine.cuh"
#include "cuda/decode/config.h"
#include "cuda/decode/decode_bits.h"
#include "cuda/decode/nvfp4_ring.cuh"
#include "cuda/decode/paging.cuh"
#include "cuda/decode/params.h"
#include "cuda/decode/tile_compute.cuh"
#include "cuda/decode/tile_loads.cuh"
#include "cuda/sm90/cp_async.cuh"
#include "cuda/sm90/ptx.cuh"
#include "fp4attn/numerics/paged_kv_codec.h"
#include "fp4attn/paged_kv.h"

namespace fp4attn::paged {

// Warp results to shared memory: O in true channel order, m and the quad's l per row.
template <int D, bool kT>
__device__ __forceinline__ void store_warp_state(DecodeWarpState<D, kT>& st, float* s_o, float* s_m,
                                                 float* s_l, int warp, int g, int t) {
  constexpr int kRows = kBlockRows<kT>;
  constexpr int RS = kORowStride<D>;
  float* wo = s_o + warp * kRows * RS;
  if constexpr (kT) {
    // Row 2t + rr's l is spread over the 8 lanes of one t.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 4);
      st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 8);
      st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 16);
    }
    // M-tile i, element e: channel phys_ot(i, g + 8 (e >> 1)) = phys_o(2i + (e >> 1), g).
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        wo[ot_row(t, e) * RS + 8 * (2 * i + (e >> 1)) + g] = st.o[i][e];
      }
    }
    if (g == 0) {
      s_m[warp * kRows + 2 * t] = st.m[0];
      s_m[warp * kRows + 2 * t + 1] = st.m[1];
      s_l[warp * kRows + 2 * t] = st.l[0];
      s_l[warp * kRows + 2 * t + 1] = st.l[1];
    }
  } else {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 1);
      st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 2);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        wo[row * RS + 8 * n + col] = st.o[n][e];
      }
    }
    if (t == 0) {
      s_m[warp * kRows + g] = st.m[0];
      s_m[warp * kRows + g + 8] = st.m[1];
      s_l[warp * kRows + g] = st.l[0];
      s_l[warp * kRows + g + 8] = st.l[1];
    }
  }
}

// kT: the transposed form, for row blocks of <= 8 rows; the host picks it when every
// sequence's rows per kv head fit (decode.cu).
template <int D, bool kFp4, bool kT = false>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinBlocks<D, kFp4, kT>)
    paged_decode_kernel(const DecodeParams p) {
  constexpr int kRows = kBlockRows<kT>;
  extern __shared__ float4 smem_f4[];
  constexpr int RS = kORowStride<D>;
  float* s_o = reinterpret_cast<float*>(smem_f4);  // [warps][kRows][RS]
  float* s_m = s_o + kDecodeWarps * kRows * RS;    // [warps][kRows]
  float* s_l = s_m + kDecodeWarps * kRows;         // [warps][kRows]

  const int split = blockIdx.x;
  const int hk = blockIdx.y / p.row_blocks, rb_first = blockIdx.y % p.row_blocks;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  int64_t q_begin;
  int sq;
  if (p.s_q > 0) {
    q_begin = static_cast<int64_t>(b) * p.s_q;
    sq = p.s_q;
  } else {
    // Unchecked device values: clamped so that no row outside [0, total_q) is touched.
    const int64_t a_raw = p.cu_seqlens_q[b], e_raw = p.cu_seqlens_q[b + 1];
    const int64_t a = min(max(a_raw, int64_t{0}), p.total_q);
    const int64_t e = min(max(e_raw, a), p.total_q);
    q_begin = a;
    sq = static_cast<int>(e - a);
    const bool bad_cu = a != a_raw || e != e_raw || (b == 0 && a_raw != 0) ||
                        (b == static_cast<int>(gridDim.z) - 1 && e_raw != p.total_q);
    if (bad_cu && p.error_flag != nullptr && threadIdx.x == 0 && split == 0 && blockIdx.y == 0) {
      atomicOr(p.error_flag, kPagedErrorCuSeqlens);
    }
  }
  const int len_raw = p.seq_lens[b];
  const bool bad_len = len_raw < 0 || static_cast<int64_t>(len_raw) >
                                          static_cast<int64_t>(p.max_pages) * p.page_size;
  const int len = bad_len ? 0 : len_raw;
  const int group = p.group;
  const int rows_total = sq * group;
  const int num_rb = (rows_total + kRows - 1) / kRows;
  const int split_size = p.split_per_seq
                             ? max(64, ((len + p.num_splits - 1) / p.num_splits + 63) & ~63)
                             : p.split_size;
  const int kbeg = split * split_size;
  const int kend_split = min(len, kbeg + split_size);
  // 0 for an uncalibrated global: its tokens are zero codes or NaN.
  const float k_factor = paged_kv_decode_factor(kFp4, __ldg(p.k.global), 256.f);
  const float v_factor = paged_kv_decode_factor(kFp4, __ldg(p.v.global), 256.f);
  const float sl2 = p.scale_log2 * k_factor;

  for (int rb = rb_first; rb < num_rb; rb += p.row_blocks) {
    const int m0 = rb * kRows;
    const int rows = min(kRows, rows_total - m0);
    // Keys [kbeg, vis) are visible to row m (token m / group): causal bottom-right.
    auto visible_end = [&](int m) {
      if (!p.causal) return kend_split;
      return max(kbeg, min(kend_split, m / group + len - sq + 1));
    };
    const int kend = visible_end(m0 + rows - 1);

    // The previous row block's merge has read the shared memory the rings reuse.
    __syncthreads();
    // Q fragments straight from global memory, loaded once the first tiles' page-id and data
    // loads are issued so that the latencies overlap (staging Q in shared memory before the loads
    // would cost a round trip and three barriers).
    uint32_t qa[D / 16][kQRegs<kT>];
    auto load_q = [&]() {
      load_q_frags<D, kFp4, kT>(p, b, q_begin, hk, group, m0, rows, g, t, qa);
    };

    // The lane's two rows: g, g + 8 (16-row form) or 2t, 2t + 1 (transposed).
    int vis[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = kT ? 2 * t + rr : g + 8 * rr;
      vis[rr] = r < rows ? visible_end(m0 + r) : kbeg;
    }
    DecodeWarpState<D, kT> st;
    init_warp_state<D, kT>(st);
    bool bad = bad_len;

    // The mainloops and the warp merge stay in the kernel body: moved into functions, the same
    // PTX came out with other register numbers, and ptxas scheduled it differently.
    constexpr int kStride = kDecodeTile * kDecodeWarps;
    if constexpr (kFp4) {
      // NVFP4: the warp's shared-memory ring, kRingStages - 1 tiles in flight.
      using R = Ring<D>;
      uint8_t* ring = reinterpret_cast<uint8_t*>(smem_f4) + warp * R::kWarpBytes;
      const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
      const RingLane rl = ring_lane<D>(p, hk, lane);
      const int32_t* bt_row = p.block_tables + b * p.bt_s0;
      int kt_in = kbeg + kDecodeTile * warp;  // the next tile to issue
      int32_t pg[kRingStages];                // page ids of the first stages, loaded together
#pragma unroll
      for (int i = 0; i < kRingStages; ++i)
        pg[i] = tile_page_row(p, bt_row, kt_in + i * kStride, kend);
#pragma unroll
      for (int i = 0; i < kRingStages - 1; ++i) {
        if (kt_in < kend) {
          ring_issue<D>(p, b, kt_in, kend, pg[i], lane, rl, ring_s + i * R::kStage, &bad);
        }
        sm90::cp_async_commit();  // (an empty group for a missing tile keeps the wait count right)
        kt_in += kStride;
      }
      load_q();
      int32_t page_next = pg[kRingStages - 1];  // the page ids run one tile ahead of the copies
      // Byte offsets of the stage to read and of the stage to refill (the one read in the
      // previous iteration; the __syncwarp at the end of an iteration ordered those reads).
      uint32_t rd = 0, in = (kRingStages - 1) * R::kStage;
      for (int kt = kbeg + kDecodeTile * warp; kt < kend; kt += kStride) {
        const int32_t page_after = tile_page_row(p, bt_row, kt_in + kStride, kend);
        if (kt_in < kend) ring_issue<D>(p, b, kt_in, kend, page_next, lane, rl, ring_s + in, &bad);
        sm90::cp_async_commit();
        page_next = page_after;
        kt_in += kStride;
        sm90::cp_async_wait<kRingStages - 1>();  // this lane's copies of tile kt have landed
        __syncwarp();                            // and every lane's are visible
        RawTile<D, kFp4> r;
        ring_read<D>(ring + rd, g, t, r);
        compute_tile_as<D, kFp4, kT>(r, qa, kt, vis, sl2, g, t, st);
        __syncwarp();
        in = rd;
        rd = rd == (kRingStages - 1) * R::kStage ? 0 : rd + R::kStage;
      }
      sm90::cp_async_wait<0>();
      __syncthreads();  // the merge below reuses the rings' shared memory
    } else {
      // Register double buffering: the next tile's loads are issued before this tile's math.
      // The page ids run one tile further ahead (tile_page).
      int kt = kbeg + kDecodeTile * warp;
      RawTile<D, kFp4> ra, rbuf;
      if (kt < kend)
        load_tile<D, kFp4>(p, b, hk, kt, kend, tile_page(p, b, kt, kend), g, t, ra, &bad);
      load_q();
      int32_t page_next = tile_page(p, b, kt + kStride, kend);
      while (kt < kend) {
        int32_t page_after = tile_page(p, b, kt + 2 * kStride, kend);
        if (kt + kStride < kend) {
          load_tile<D, kFp4>(p, b, hk, kt + kStride, kend, page_next, g, t, rbuf, &bad);
        }
        page_next = page_after;
        compute_tile_as<D, kFp4, kT>(ra, qa, kt, vis, sl2, g, t, st);
        kt += kStride;
        if (kt >= kend) break;
        page_after = tile_page(p, b, kt + 2 * kStride, kend);
        if (kt + kStride < kend) {
          load_tile<D, kFp4>(p, b, hk, kt + kStride, kend, page_next, g, t, ra, &bad);
        }
        page_next = page_after;
        compute_tile_as<D, kFp4, kT>(rbuf, qa, kt, vis, sl2, g, t, st);
        kt += kStride;
      }
    }

    store_warp_state<D, kT>(st, s_o, s_m, s_l, warp, g, t);
    const bool any_bad = __syncthreads_or(bad);
    if (any_bad && p.error_flag != nullptr && threadIdx.x == 0) {
      atomicOr(p.error_flag, bad_len ? kPagedErrorSeqLen : kPagedErrorPageId);
    }

    // Merge the warps and write: 8 threads per row, d/8 consecutive channels each.
    const int row = threadIdx.x / 8, part = threadIdx.x % 8;
    if (row < rows) {
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w * kRows + row]);
      const float ref = mx == -INFINITY ? 0.f : mx;
      float f[kDecodeWarps], l = 0.f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        f[w] = sm90::fast_exp2(s_m[w * kRows + row] - ref);
        l += f[w] * s_l[w * kRows + row];
      }
      const float nan = __int_as_float(0x7FC00000);
      const float inv = l > 0.f ? v_factor / l : 0.f;
      float row_lse;  // natural log
      if (any_bad || l != l) {
        row_lse = nan;
      } else if (l > 0.f) {
        row_lse = (ref + __log2f(l)) * 0.6931471805599453f;
      } else {
        row_lse = p.write_partials ? -INFINITY : INFINITY;
      }
      const int m = m0 + row, i = m / group, hq = hk * group + m % group;
      const int64_t grow = q_begin + i;
      if (p.write_partials) {
        float* dst = p.o_part + ((static_cast<int64_t>(split) * p.total_q + grow) * p.h + hq) * D;
        for (int n = 0; n < D / 8; ++n) {
          const int c = phys_o<D>(n, part);
          float acc = 0.f;
#pragma unroll
          for (int w = 0; w < kDecodeWarps; ++w) {
            acc += f[w] * s_o[(w * kRows + row) * RS + 8 * n + part];
          }
          dst[c] = any_bad ? nan : (l > 0.f ? acc * inv : (l == 0.f ? 0.f : nan));
        }
        if (part == 0) {
          p.lse_part[(static_cast<int64_t>(split) * p.total_q + grow) * p.h + hq] = row_lse;
        }
      } else {
        const int64_t base = (p.s_q > 0 ? b * p.o_sb + i * p.o_si : grow * p.o_sb) + hq * p.o_sh;
        for (int n = 0; n < D / 8; ++n) {
          const int c = phys_o<D>(n, part);
          float acc = 0.f;
#pragma unroll
          for (int w = 0; w < kDecodeWarps; ++w) {
            acc += f[w] * s_o[(w * kRows + row) * RS + 8 * n + part];
          }
          const float val = any_bad ? nan : (l > 0.f ? acc * inv : (l == 0.f ? 0.f : nan));
          const __nv_bfloat16 h = __float2bfloat16_rn(val);
          p.o[base + c] = *reinterpret_cast<const uint16_t*>(&h);
        }
        if (part == 0 && p.lse != nullptr) {
          p.lse[(p.s_q > 0 ? b * p.l_sb + i * p.l_si : grow * p.l_sb) + hq * p.l_sh] = row_lse;
        }
      }
    }
  }

  if (p.counters != nullptr) {
    fused_combine<D, kT>(p, q_begin, hk, group, rb_first, num_rb, rows_total,
                         reinterpret_cast<float*>(smem_f4));
  }
}

}  // namespace fp4attn::paged
