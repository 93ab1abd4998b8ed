// The backward's main kernel, v2 on FP8 wgmma (docs/kernels/bwd_sm90.md "v2"), with v1's
// numerics (main_kernel.cuh: the same operand bytes, scales, roundings and masks) but for the FP32
// accumulation order and the element math of "v2: the instruction diet" (P as exp2 of the lifted
// argument on MUFU alone, power-of-two factors folded into one multiply per operand).
//
// One CTA of 384 threads per (key block of 128, batch, kv head). Warp 0 produces: per step (a
// query head of the GQA group and a block of 64 queries) it loads Q, dO_v, dO_t and Q_t by TMA
// and the LSE / D rows and the Q factor by plain loads into a ring of v2_stages stages. Consumer
// warpgroup cw (1 + cw) owns keys 64cw..64cw+63 of the block and per step computes
//   S^T  = K Q^T       (ss, E4M3 x E4M3)   -> 2^8 P = exp2(S c - LSE log2 e + 8), 0 if masked
//   dP^T = V dO_v^T    (ss, E4M3 x E5M2)   -> dS = P * (dP * 2^-g' - D)
//   dV  += (2^8 P)^T dO_t           (rs: P^T from the S^T accumulator, E4M3 x E5M2)
//   dK  += (2^h' dS q_scale)^T Q_t   (rs: dS^T from the dP^T accumulator, E4M3 x E4M3)
//   dQ_acc[query block][channels of cw] += (2^h dS k_scale) K   (ss over all 128 keys: both
//       warpgroups write their keys' dS bytes to shared memory first; dq_bulk: the tile staged in
//       shared memory and added by TMA reduce-add from one thread per warpgroup, else
//       red.global.add.v2.f32; in key-block order when deterministic)
// kDqBulk (gradient pass, BwdParams::dq_bulk): dQ by TMA reduce-add, else by red.global.
// kAmax: S, P, dP, dS and the amax of dS * k_scale and dS * q_scale per (batch, head) only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/attention/p_paths.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/wgmma_fp8.cuh"
#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_device.cuh"
#include "cuda/backward/bwd_params.h"
#include "cuda/backward/mma_fp8.cuh"
#include "cuda/backward/v2_layout.h"

namespace fp4attn::bwd {

// Named barriers (0 is __syncthreads): both consumer warpgroups' dS bytes are in shared memory;
// the deterministic dQ turn; consumer warpgroup cw's dQ tile is staged (kV2DqBarrier + cw).
constexpr int kV2DsBarrier = 1;
constexpr int kV2TurnBarrier = 2;
constexpr int kV2DqBarrier = 3;           // and 4: per consumer warpgroup
constexpr int kV2TileMaxBarrier = 5;      // the gradient pass's tile max of |dS| (both warpgroups)
constexpr float kCodeMagic = 12582912.f;  // 1.5 2^23: integers in a float's low mantissa bits
// fp4-direct: the 32-key block maxima meet per warp pair (warps 2k, 2k + 1 of warpgroup cw) on
// barrier kV2PairBarrier + 2 cw + k, 64 threads.
constexpr int kV2PairBarrier = 6;

// Barrier kBase + cw over warpgroup cw's 128 threads. The id is an immediate, so that ptxas
// counts the barriers the kernel names, not all 16.
template <int kBase>
__device__ __forceinline__ void v2_wg_sync(int cw) {
  if (cw == 0) {
    asm volatile("bar.sync %0, 128;" ::"n"(kBase) : "memory");
  } else {
    asm volatile("bar.sync %0, 128;" ::"n"(kBase + 1) : "memory");
  }
}

// Bulk-async helpers of the dQ reduce (the issuing thread's bulk group).
// dq_acc box (c0 channel, c1 query, c2 batch * head) += the swizzled FP32 box at src.
__device__ __forceinline__ void v2_tma_reduce_add_3d(const CUtensorMap* map, const void* src,
                                                     int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], "
      "[%1];" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(sm90::smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void v2_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Until every bulk group of this thread is complete (its global writes performed).
__device__ __forceinline__ void v2_bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Orders this thread's generic-proxy global accesses with its async-proxy ones.
__device__ __forceinline__ void v2_fence_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// The descriptor of k-step kk (32 bytes further, 2 in the start-address field): added to the low
// word only (the field is 14 bits of a shared-memory address below 2^18: it cannot carry), which
// saves the 64-bit add and its moves before every wgmma.
__device__ __forceinline__ uint64_t v2_desc_at(uint64_t desc, int kk) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + 2u * uint32_t(kk));
}

// Step `it` of the CTA's (head, query block) sequence in the stage ring.
template <int kStages>
__device__ __forceinline__ int v2_stage(int it) {
  return it % kStages;
}
template <int kStages>
__device__ __forceinline__ uint32_t v2_parity(int it) {
  return uint32_t(it / kStages) & 1u;
}

// 4 x 4 byte transpose: byte j of out[i] is byte i of in[j] (four rows of four bytes become four
// columns), so that a transposed tile is written with 32-bit stores instead of byte stores.
__device__ __forceinline__ void v2_transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), lo23 = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t hi01 = __byte_perm(in[0], in[1], 0x7362), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

__device__ __forceinline__ uint32_t v2_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// K (zero past s_k), K^T and V (un-permuted from the forward's V^T), swizzled, once per CTA.
// Each thread takes 4 x 16-byte rows and writes their transpose as 4-byte columns: K^T from 4
// keys x 16 channels, V from 4 channels x 16 positions of V^T (positions become keys through
// operand_v_key_at).
template <int D, bool kAmax>
__device__ __forceinline__ void v2_load_kv(const BwdParams& p, V2Smem<D, kAmax>& sm, int bhk,
                                           int n0) {
  const uint8_t* kg = p.k + int64_t(bhk) * p.s_k * D;
  for (int idx = threadIdx.x; idx < (kV2Keys / 4) * (D / 16); idx += kV2Threads) {
    const int r0 = (idx / (D / 16)) * 4, c16 = (idx % (D / 16)) * 16;
    uint4 rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rows[i] = make_uint4(0, 0, 0, 0);
      if (n0 + r0 + i < p.s_k) {
        rows[i] = *reinterpret_cast<const uint4*>(kg + int64_t(n0 + r0 + i) * D + c16);
      }
      *reinterpret_cast<uint4*>(&sm.k[swizzle_offset(r0 + i, c16, D)]) = rows[i];
    }
    if constexpr (!kAmax) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t in[4] = {v2_word(rows[0], w), v2_word(rows[1], w), v2_word(rows[2], w),
                                v2_word(rows[3], w)};
        uint32_t out[4];
        v2_transpose4x4(in, out);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          *reinterpret_cast<uint32_t*>(&sm.kt[swizzle_offset(c16 + 4 * w + j, r0, kV2Keys)]) =
              out[j];
        }
      }
    }
  }
  const uint8_t* vg = p.vt + int64_t(bhk) * D * p.vt_pitch;
  for (int idx = threadIdx.x; idx < (D / 4) * (kV2Keys / 16); idx += kV2Threads) {
    const int c0 = (idx / (kV2Keys / 16)) * 4, p16 = (idx % (kV2Keys / 16)) * 16;
    uint4 rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rows[i] = make_uint4(0, 0, 0, 0);
      if (n0 + p16 < p.vt_pitch) {  // the pitch is a multiple of 16: whole groups
        rows[i] = *reinterpret_cast<const uint4*>(vg + int64_t(c0 + i) * p.vt_pitch + n0 + p16);
      }
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t in[4] = {v2_word(rows[0], w), v2_word(rows[1], w), v2_word(rows[2], w),
                              v2_word(rows[3], w)};
      uint32_t out[4];  // out[j]: channels c0..c0 + 3 of position p16 + 4w + j
      v2_transpose4x4(in, out);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t key = uint32_t(operand_v_key_at(p16 + 4 * w + j));
        *reinterpret_cast<uint32_t*>(&sm.v[swizzle_offset(key, c0, D)]) = out[j];
      }
    }
  }
}

// The exp-free recipes' per-query-row constants, from the forward's integer reference m and LSE
// (l = 2^(LSE log2 e - m) the denominator in units of 2^m). Rows past s_q or without keys get
// pscale 0, which zeroes their P, and a finite first constant.
// * nvfp4-fast (numerics.md §4): P is the E4M3 code c = clamp(RNE(8 (z - m)) + 120, 0, 120) over
//   the sum of the codes' values, so 2^8 p = value(c) 2^(m - LSE log2 e). `row` = the code bias
//   1.5 2^23 + 120 - 8 m (the FFMA lands c in the low mantissa bits, as the forward's), pscale =
//   2^(120 + m - LSE log2 e), whose 2^120 undoes the code's placement in v2_p_elements.
// * fp4-direct (numerics.md §5): the P operand is E4M3(q 2^(e + 6)) with q the E2M1 code of its
//   32-key block (exponent e_B from the block's largest z - m), worth p = operand 2^-6 / 6 / l.
//   `row` = m itself, pscale = 2^(8 - 6 - log2 6 + m - LSE log2 e): 2^8 p = operand pscale.
template <int kP>
__device__ __forceinline__ void v2_exp_free_rows(const BwdParams& p, int bb, int hq, int64_t i,
                                                 bool in, float* row, float* pscale) {
  static_assert(kP == kBwdCodes || kP == kBwdDirect);
  float m = -INFINITY, lse = INFINITY;
  if (in) {
    m = p.row_max[bb * p.row_max_stride[0] + hq * p.row_max_stride[1] + i];
    lse = p.lse[bb * p.lse_stride[0] + hq * p.lse_stride[1] + i];
  }
  const bool keys = m > -INFINITY && lse < INFINITY;
  constexpr float kUnitLog2 = kP == kBwdCodes ? 120.f : 2.f - kLog2Six;
  if constexpr (kP == kBwdCodes) {
    *row = keys ? kCodeMagic + 120.f - 8.f * m : kCodeMagic;
  } else {
    *row = keys ? m : 0.f;
  }
  *pscale = keys ? exp2f(kUnitLog2 + m - lse * 1.4426950408889634f) : 0.f;
}

// Warp 0: the (head, query block) steps' tiles into the stage ring.
template <int D, bool kAmax, int kP>
__device__ __forceinline__ void v2_produce(const BwdV2Params& P, V2Smem<D, kAmax>& sm, int bb,
                                           int hk, int mb_begin, int mb_end) {
  const BwdParams& p = P.p;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    sm90::prefetch_tensor_map(&P.tm_q);
    sm90::prefetch_tensor_map(&P.tm_dov);
    if constexpr (!kAmax) {
      sm90::prefetch_tensor_map(&P.tm_dot);
      sm90::prefetch_tensor_map(&P.tm_qt);
    }
  }
  constexpr uint32_t kBytes = (kAmax ? 2 : 4) * kV2Queries * D;
  const int group = p.h / p.h_kv;
  int it = 0;
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int bh = bb * p.h + hq;
    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      constexpr int kStages = V2Smem<D, kAmax>::kStages;
      const int s = v2_stage<kStages>(it);
      if (it >= kStages) sm90::mbar_wait(&sm.empty[s], v2_parity<kStages>(it) ^ 1u);
      const int q0 = mb * kV2Queries;
#pragma unroll
      for (int r = 0; r < kV2Queries / 32; ++r) {
        const int il = r * 32 + lane;
        const int64_t i = q0 + il;
        const bool in = i < p.s_q;
        if constexpr (kP != kBwdExp2) {
          v2_exp_free_rows<kP>(p, bb, hq, i, in, &sm.lse2[s][il], &sm.pscale[s][il]);
        } else {
          // LSE * log2 e - 8: exp2 of z minus it is 2^8 p, the P operand's lift (kPLiftLog2).
          sm.lse2[s][il] = in ? fmaf(p.lse[bb * p.lse_stride[0] + hq * p.lse_stride[1] + i],
                                     1.4426950408889634f, -float(kPLiftLog2))
                              : __int_as_float(0x7f800000);
        }
        sm.dsum[s][il] = in ? p.dsum[int64_t(bh) * p.s_q + i] : 0.f;
      }
      if (lane == 0) {
        sm.q_scale[s] = p.q_scale[int64_t(bh) * ((p.s_q + 127) / 128) + q0 / 128];
        sm90::mbar_arrive_expect_tx(&sm.full[s], kBytes);
        sm90::tma_load_3d(sm.st[s].q, &P.tm_q, &sm.full[s], 0, q0, bh);
        sm90::tma_load_3d(sm.st[s].dov, &P.tm_dov, &sm.full[s], 0, q0, bh);
        if constexpr (!kAmax) {
          sm90::tma_load_3d(sm.st[s].dot, &P.tm_dot, &sm.full[s], q0, 0, bh);
          sm90::tma_load_3d(sm.st[s].qt, &P.tm_qt, &sm.full[s], q0, 0, bh);
        }
      } else {
        sm90::mbar_arrive(&sm.full[s]);
      }
    }
  }
}

// Deterministic dQ (v1's scheme, per 64-query block): key block n adds after key blocks 0..n-1.
__device__ __forceinline__ void v2_wait_turn(const int* turn, int want) {
  if (threadIdx.x == kV2Threads - kV2Consumers) {
    int v;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
    } while (v != want);
  }
  sm90::named_barrier_sync(kV2TurnBarrier, kV2Consumers);
}

__device__ __forceinline__ void v2_pass_turn(int* turn) {
  __threadfence();
  sm90::named_barrier_sync(kV2TurnBarrier, kV2Consumers);
  if (threadIdx.x == kV2Threads - kV2Consumers) atomicAdd(turn, 1);
}

// One reduce-scatter step over the 8 lanes sharing t (lane bits 2..4): of 2W partial sums, a lane
// keeps the half its lane bit `mask` selects, adding its partner's copy of that half.
template <int W>
__device__ __forceinline__ void v2_halve(float (&v)[16], int lane, int mask) {
  const bool upper = (lane & mask) != 0;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float send = upper ? v[i] : v[i + W];
    const float keep = upper ? v[i + W] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
  }
}

// dq_bulk: warpgroup cw's dQ tile (query rows of the block x channels cw D / 2..) into the
// staging buffer of the step's parity, then one thread (the warpgroup's first) adds its D / 64
// boxes into dq_acc by TMA reduce-add (rows past s_q are outside the map: not added). The other
// warps only arrive on the staging barrier and go on to the next step; the buffer is rewritten two
// steps later, after the issuer's wait_group.read before that step's dS barrier.
// Deterministic: the issuer adds after key blocks 0..n-1 (a turn per query block and warpgroup,
// the warpgroups' channels being disjoint) and passes the turn once its adds are performed.
template <int D>
__device__ __forceinline__ void v2_add_dq_bulk(const BwdParams& p, const CUtensorMap* tm_dq,
                                               V2Smem<D, false>& sm, const float (&dq)[D / 4],
                                               int it, int cw, int n, int64_t bh, int mb) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  constexpr int kBoxes = D / 2 / kV2DqBoxCols;  // per warpgroup
  uint8_t* stage = sm.dq[it & 1][cw * kBoxes];
  // Element e, e + 1: row 16 warp + g + 8 h, channels c = accum_col(e, t) + 0 / 1 of the
  // warpgroup's, i.e. box c / 32 at bytes swizzle_offset(row, 4 (c % 32), 128) = row * 128 +
  // ((32 j + 8t) ^ 16 (row % 8)) with j = (e / 4) % 4 and row % 8 = g: one base per thread, XOR
  // 32 j, plus immediates (box, h). Each warp store meets every 16-byte chunk of a row twice: two
  // wavefronts, the least for 256 bytes (unswizzled rows would take eight).
  uint8_t* const base = stage + (warp * 16 + g) * 128;
  const uint32_t x = (8 * t) ^ (16 * g);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint8_t* const at = base + (x ^ (32 * j));
#pragma unroll
    for (int e = 4 * j; e < D / 4; e += 16) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        static_assert(accum_col(0, 0) == 0 && accum_row_half(2) == 1);
        const int box = e / 16;  // accum_col(e, t) / 32
        *reinterpret_cast<float2*>(at + box * kV2DqBoxBytes + h * 8 * 128) =
            make_float2(dq[e + 2 * h], dq[e + 2 * h + 1]);
      }
    }
  }
  sm90::fence_async_shared();  // the generic-proxy writes, before the bulk reduce reads them
  // The issuer waits for the warpgroup's writes. Every warp syncs (warps 1-3 could only arrive):
  // compute-sanitizer racecheck does not model bar.arrive beside other named barriers and then
  // reports false hazards on them (race_probe --tile-max-arrive; docs/kernels/bwd_sm90.md).
  v2_wg_sync<kV2DqBarrier>(cw);
  if (tid == 0) {
    // Deterministic: this warpgroup's turn of the query block (the pointer formed at each use).
    auto turn = [&] { return p.dq_turn + (bh * (p.s_q_pad / kV2Queries) + mb) * 2 + cw; };
    if (p.deterministic) {
      int v;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn()) : "memory");
      } while (v != n);
      v2_fence_async_global();  // the earlier key blocks' adds, before this thread's reduces
    }
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      v2_tma_reduce_add_3d(tm_dq, stage + b * kV2DqBoxBytes, (cw * kBoxes + b) * kV2DqBoxCols,
                           mb * kV2Queries, int(bh));
    }
    sm90::bulk_commit();
    if (p.deterministic) {
      v2_bulk_wait_all();  // performed, not only read
      v2_fence_async_global();
      __threadfence();
      atomicAdd(turn(), 1);
    }
  }
}

// The FP8 A operand (two k-steps of 32 queries) from a 64 x 64 accumulator (bwd_bits.h
// a_source_element): P^T or dS^T with no shuffle, against the permuted dO_t / Q_t.
__device__ __forceinline__ void v2_pack_a(const float (&x)[32], uint32_t (&a)[2][4]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float* g = x + 16 * kk;
      a[kk][r] = e4m3x4(g[a_source_element(r, 0)], g[a_source_element(r, 1)],
                        g[a_source_element(r, 2)], g[a_source_element(r, 3)]);
    }
  }
}

template <int N>
__device__ __forceinline__ void v2_fence(float (&r)[N]) {
  sm90::fence_regs(r);
}
__device__ __forceinline__ void v2_fence(uint32_t (&a)[2][4]) {
  sm90::fence_regs(a[0]);
  sm90::fence_regs(a[1]);
}

// dK and dV of the warpgroup's 64 keys in the gradients' dtype.
template <int D>
__device__ __forceinline__ void v2_store_kv(const BwdParams& p, const float (&dk)[D / 2],
                                            const float (&dv)[D / 2], int u_dk, int u_dv, int bb,
                                            int hk, int key0, int t) {
  const Pow2 uk(u_dk), uv(u_dv);
#pragma unroll
  for (int e = 0; e < D / 2; ++e) {
    const int64_t key = key0 + 8 * accum_row_half(e);
    const int c = accum_col(e, t);
    if (key < p.s_k) {
      store_grad(p.dk, bb * p.dk_stride[0] + key * p.dk_stride[1] + hk * p.dk_stride[2] + c,
                 p.dk_f32, uk(dk[e]) * p.softmax_scale);
      store_grad(p.dv, bb * p.dv_stride[0] + key * p.dv_stride[1] + hk * p.dv_stride[2] + c,
                 p.dv_f32, uv(dv[e]));
    }
  }
}

// Element e (row half h) of a consumer thread's step is visible iff lo[h] <= its local query
// column < hi[h]: the mask of key_visible (tails of both lengths, bottom-right causal) in two
// compares. `full` (warp-uniform): every element of the warp is visible (all steps but the causal
// diagonal and the tails), and the loops skip the mask.
struct V2Mask {
  int lo[2], hi[2];
  bool full;
  __device__ __forceinline__ bool visible(int e, int t) const {
    const int c = accum_col(e, t), h = accum_row_half(e);
    return c >= lo[h] && c < hi[h];
  }
};

// key: the thread's first key row (n0 + key_l); q0: the step's first query.
__device__ __forceinline__ V2Mask v2_mask(const BwdParams& p, int key, int q0) {
  V2Mask m;
  const int q_lim = min(p.s_q - q0, kV2Queries);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k = key + 8 * h;
    m.lo[h] = p.causal ? max(0, k - (p.s_k - p.s_q) - q0) : 0;
    m.hi[h] = k < p.s_k ? q_lim : 0;
  }
  m.full = __all_sync(
      0xffffffffu, m.lo[0] == 0 && m.lo[1] == 0 && m.hi[0] == kV2Queries && m.hi[1] == kV2Queries);
  return m;
}

// The LSE / D pair of the columns 8j + 2t, 8j + 2t + 1 of elements 4j..4j + 3 (element e takes
// .x when e is even).
__device__ __forceinline__ float2 v2_col_pair(const float* v, int j, int t) {
  return *reinterpret_cast<const float2*>(v + accum_col(4 * j, t));
}

// The step's factor of the raw scores: z = S zc (exp2 recipes); for the codes 8 z and for
// fp4-direct z, with the product in the forward's order (q_scale scale_log2) k_scale, so that the
// codes are the forward's.
template <int kP>
__device__ __forceinline__ float v2_score_factor(float qs, float ks, float scale_log2) {
  if constexpr (kP == kBwdCodes) return 8.f * ((qs * scale_log2) * ks);
  if constexpr (kP == kBwdDirect) return (qs * scale_log2) * ks;
  return qs * ks * scale_log2;
}

// P lifted, sc = 2^8 p, 0 where masked. exp2 recipes: exp2(S c - (LSE log2 e - 8)), MUFU.EX2
// alone (flush to zero below 2^-126, where the P operand and every dS byte are 0 anyway).
// kBwdCodes (nvfp4-fast, v2_exp_free_rows): the code c = max(RNE(S 8c + bias), 1.5 2^23) - 1.5
// 2^23; shifted left by 20 its bits are a float worth value(c) 2^-120 (exponent field c >> 3,
// mantissa (c & 7) << 20; codes below 8 land as FP32 subnormals, exact as E4M3's), and pscale
// restores 2^120 / l 2^(m + 8 - m). The FMUL must not flush subnormals (no -ftz here).
template <bool kMasked, int kP>
__device__ __forceinline__ void v2_p_elements(float (&sc)[32], const V2Mask& m, const float* lse2,
                                              const float* pscale, float zc, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 l = v2_col_pair(lse2, j, t);
    float2 ps;
    if constexpr (kP == kBwdCodes) ps = v2_col_pair(pscale, j, t);
#pragma unroll
    for (int e = 4 * j; e < 4 * j + 4; ++e) {
      float pv;
      if constexpr (kP == kBwdCodes) {
        const float code = fmaxf(fmaf(sc[e], zc, (e & 1) ? l.y : l.x), kCodeMagic);
        pv = __uint_as_float(__float_as_uint(code) << 20) * ((e & 1) ? ps.y : ps.x);
      } else {
        pv = sm90::fast_exp2(fmaf(sc[e], zc, -((e & 1) ? l.y : l.x)));
      }
      sc[e] = (!kMasked || m.visible(e, t)) ? pv : 0.f;
    }
  }
}

// fp4-direct (v2_exp_free_rows): a thread holds keys g, g + 8 of its warp's 16 (the S^T rows) for
// 16 query columns; a 32-key block is a warp pair's 32 keys. Its maxima per column: over the two
// rows, the 8 lanes of equal t (3 shuffles each), then the pair's other warp through `slab`
// (lanes with g = 0 write [warp][column], a 64-thread barrier, every thread reads its columns of
// both warps). Then per column the forward's direct_row (p_paths.cuh: exponent, unit, the FFMA.SAT
// constant) and per element direct_operand with the clamp at 6 (valid for every |m|): q 2^(e + 6)
// as the forward's operand, except blocks 14 binades below the row max, whose E4M3 rounding the
// forward's pack adds (P there is below 2^-14 of the row's largest). Masked keys: -inf for the
// maxima, P = 0.
struct V2DirectPair {
  float (*slab)[kV2Queries];  // [4 warps][64 columns] of this step's buffer
  int bar;                    // the pair's barrier id
};
template <bool kMasked>
__device__ __forceinline__ void v2_p_direct(float (&sc)[32], const V2Mask& m, const float* m_row,
                                            const float* pscale, float c, int t,
                                            const V2DirectPair& pair) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if constexpr (kMasked) {
#pragma unroll
    for (int e = 0; e < 32; ++e) sc[e] = m.visible(e, t) ? sc[e] : -INFINITY;
  }
  float cm[16];  // column 8 (k / 2) + 2t + k % 2: elements 4 (k / 2) + k % 2 and + 2
#pragma unroll
  for (int k = 0; k < 16; ++k) cm[k] = fmaxf(sc[4 * (k / 2) + k % 2], sc[4 * (k / 2) + k % 2 + 2]);
#pragma unroll
  for (int x = 4; x < 32; x *= 2) {
#pragma unroll
    for (int k = 0; k < 16; ++k) cm[k] = fmaxf(cm[k], __shfl_xor_sync(0xffffffffu, cm[k], x));
  }
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(&pair.slab[warp][accum_col(4 * j, t)]) =
          make_float2(cm[2 * j], cm[2 * j + 1]);
    }
  }
  asm volatile("bar.sync %0, 64;" ::"r"(pair.bar) : "memory");
  const float ac8 = (kDirectA / 8) * c;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 mm = v2_col_pair(m_row, j, t), ps = v2_col_pair(pscale, j, t);
    // Both warps' maxima from shared memory: cm is dead after the barrier (registers are short).
    const float2 own = v2_col_pair(pair.slab[warp], j, t);
    const float2 ob = v2_col_pair(pair.slab[warp ^ 1], j, t);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float bmax = fmaxf(b ? own.y : own.x, b ? ob.y : ob.x);
      const sm90::DirectRow row = sm90::direct_row(bmax, c, b ? mm.y : mm.x);
      const DirectKeyMap km = direct_key_map(row.sc);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h + b;
        const float v = direct_operand<true>(fma_sat(sc[e], ac8, row.k08), km) * (b ? ps.y : ps.x);
        sc[e] = (!kMasked || m.visible(e, t)) ? v : 0.f;
      }
    }
  }
}

template <int kP>
__device__ __forceinline__ void v2_p_step(float (&sc)[32], const V2Mask& m, const float* lse2,
                                          const float* pscale, float zc, int t,
                                          const V2DirectPair& pair) {
  if constexpr (kP == kBwdDirect) {
    if (m.full) {
      v2_p_direct<false>(sc, m, lse2, pscale, zc, t, pair);
    } else {
      v2_p_direct<true>(sc, m, lse2, pscale, zc, t, pair);
    }
  } else if (m.full) {
    v2_p_elements<false, kP>(sc, m, lse2, pscale, zc, t);
  } else {
    v2_p_elements<true, kP>(sc, m, lse2, pscale, zc, t);
  }
}

// The warp pair's slab buffer `buf` of warpgroup cw and its barrier (fp4-direct).
template <int D, bool kAmax>
__device__ __forceinline__ V2DirectPair v2_direct_pair(V2Smem<D, kAmax>& sm, int cw, int buf) {
  const int warp = (threadIdx.x % 128) / 32;
  return {sm.dslab[cw][buf], kV2PairBarrier + 2 * cw + warp / 2};
}

// Gradient pass, consumer warpgroup cw (0, 1): keys n0 + 64cw.. of the block.
template <int D, bool kDqBulk, int kP>
__device__ __forceinline__ void v2_consume(const BwdParams& p, const CUtensorMap* tm_dq,
                                           V2Smem<D, false>& sm, int cw, int bb, int hk, int n,
                                           int mb_begin, int mb_end) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n0 = n * kV2Keys;
  const int key_l = cw * 64 + warp * 16 + g;  // block-local key of this thread's first row
  const int group = p.h / p.h_kv;
  const int bhk = bb * p.h_kv + hk;
  const float ks = p.k_scale[int64_t(bhk) * ((p.s_k + 127) / 128) + n];
  const uint64_t desc_k = sm90::make_kmajor_desc(sm.k + cw * 64 * D, D);
  const uint64_t desc_v = sm90::make_kmajor_desc(sm.v + cw * 64 * D, D);
  const uint64_t desc_kt = sm90::make_kmajor_desc(sm.kt + cw * (D / 2) * kV2Keys, kV2Keys);

  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.f;
  // dv * 2^u_dv(hq) is dV and dk * 2^u_dk(hq) * softmax_scale is dK while head hq's steps add to
  // them: recomputed from the (read-only here) amax record where needed rather than carried, two
  // registers fewer across the step loop.
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
    // mul_pow2 by this head's exponent, branch-free (Pow2 in bwd_bits.h: the same bits).
    const Pow2 dp_unit(-g_dp);
    bool e_head_set = false;  // the head's running exponent of dK's operand, once a tile has dS
    int e_head = 0;

    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      constexpr int kStages = V2Smem<D, false>::kStages;
      const int s = v2_stage<kStages>(it);
      const int q0 = mb * kV2Queries;
      const uint64_t desc_q = sm90::make_kmajor_desc(sm.st[s].q, D);
      const uint64_t desc_dov = sm90::make_kmajor_desc(sm.st[s].dov, D);
      float sc[32], dp[32];
      sm90::mbar_wait(&sm.full[s], v2_parity<kStages>(it));
      const float qs = sm.q_scale[s];  // the producer's copy: no global load on this path
      const float zc = v2_score_factor<kP>(qs, ks, p.scale_log2);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        sm90::wgmma_ss<64, false>(sc, v2_desc_at(desc_k, kk), v2_desc_at(desc_q, kk), kk > 0);
      }
      sm90::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        sm90::wgmma_ss<64, true>(dp, v2_desc_at(desc_v, kk), v2_desc_at(desc_dov, kk), kk > 0);
      }
      sm90::wgmma_commit();

      const V2Mask mask = v2_mask(p, n0 + key_l, q0);
      const float* dsum = sm.dsum[s];
      sm90::wgmma_wait<1>();
      v2_fence(sc);
      v2_p_step<kP>(sc, mask, sm.lse2[s], sm.pscale[s], zc, t, v2_direct_pair(sm, cw, it & 1));
      v2_fence(sc);  // P is computed here, while the dP^T wgmmas run, not after their wait
      sm90::wgmma_wait<0>();
      v2_fence(dp);
      // sc holds 2^8 p, so 2^8 dS = sc (dP 2^-g' - D): first into dp (masked), with this thread's
      // max |2^8 dS|.
      float m = 0.f;
      auto ds_raw = [&](auto single, auto masked) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 dd = v2_col_pair(dsum, j, t);
#pragma unroll
          for (int e = 4 * j; e < 4 * j + 4; ++e) {
            const float dse =
                sc[e] * (dp_unit.apply<decltype(single)::value>(dp[e]) - ((e & 1) ? dd.y : dd.x));
            dp[e] = (!decltype(masked)::value || mask.visible(e, t)) ? dse : 0.f;
            m = fmaxf(m, fabsf(dp[e]));
          }
        }
      };
      if (dp_unit.single()) {
        if (mask.full) {
          ds_raw(std::true_type{}, std::false_type{});
        } else {
          ds_raw(std::true_type{}, std::true_type{});
        }
      } else {
        ds_raw(std::false_type{}, std::true_type{});
      }
      // The tile's max |dS| over both warpgroups (8 warps' maxima by step parity: rewritten two
      // steps later, after every reader passed the next step's barriers).
      m = warp_max(m);
      sm.tile_max[it & 1][cw * 4 + warp][lane] = m;  // every lane its own slot (no branch)
      asm volatile("bar.sync %0, %1;" ::"n"(kV2TileMaxBarrier), "n"(kV2Consumers) : "memory");
      float tile = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) tile = fmaxf(tile, sm.tile_max[it & 1][w][lane]);
      tile *= 1.f / float(1 << kPLiftLog2);  // max |dS| (scaling by 2^-8 commutes with the max)
      // dQ's exponent: the tile's own; dK's: the head's running minimum, the sums scaled down to
      // it (before this step's dK wgmma; the last one completed at the last step's wait).
      const int h_dq = pow2_scale_exp(tile * ks, kE4m3Top);
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
      // dS_k bytes of element e at ds_at[e % 2][row half] + 1024 (e / 4): query row
      // 8 (e / 4) + 2t + e % 2, key column key_l + 8 h, swizzled (row % 8 = 2t + e % 2).
      uint8_t* ds_tile = sm.ds[it & 1];
      uint32_t ds_at[2][2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ds_at[b][h] = swizzle_offset(2 * t + b, key_l + 8 * h, kV2Keys);
        }
      }
      // The operands: the fast form folds 2^-8 into one factor per operand, fq = q_scale
      // 2^(e_acc - 8) and fk = k_scale 2^(h_dq - 8) (exact: normal powers of two times normal
      // scales), one multiply each; the general form (exponents or factors out of FP32's normal
      // range: tiny or huge tiles) divides by 2^8 and applies Pow2. Both round the same real
      // numbers once per operation.
      const Pow2 to_dk8(e_acc - kPLiftLog2), to_dq8(h_dq - kPLiftLog2);
      const float fq = to_dk8.apply<true>(qs), fk = to_dq8.apply<true>(ks);
      auto normal = [](float x) { return x >= 1.17549435e-38f && x <= 3.4e38f; };
      const bool fast = to_dk8.single() && to_dq8.single() && normal(fq) && normal(fk);
      const Pow2 to_dk(e_acc), to_dq(h_dq);
      auto ds_quant = [&](auto fast_form) {
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
          // Elements 4j, 4j + 1 (row half 0) and 4j + 2, 4j + 3 (row half 1): one conversion
          // per pair, the two bytes to their query rows.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t pair = e4m3x2(bq[2 * h], bq[2 * h + 1]);
            uint8_t* row = ds_tile + 1024 * j;
            row[ds_at[0][h]] = uint8_t(pair);
            row[ds_at[1][h]] = uint8_t(pair >> 8);
          }
        }
      };
      if (fast) {
        ds_quant(std::true_type{});
      } else {
        ds_quant(std::false_type{});
      }
      uint32_t pa[2][4], da[2][4];
      v2_pack_a(sc, pa);
      v2_pack_a(dp, da);
      const uint64_t desc_dot = sm90::make_kmajor_desc(sm.st[s].dot, kV2Queries);
      const uint64_t desc_qt = sm90::make_kmajor_desc(sm.st[s].qt, kV2Queries);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        sm90::wgmma_rs<D, true>(dv, pa[kk], v2_desc_at(desc_dot, kk), 1);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        sm90::wgmma_rs<D, false>(dk, da[kk], v2_desc_at(desc_qt, kk), 1);
      sm90::wgmma_commit();

      // dQ: both warpgroups' dS bytes (generic-proxy writes) before the wgmma reads them. With
      // kDqBulk the issuing thread first waits until the reduce of step it - 2 has read the dQ
      // staging buffer that this step rewrites after the barrier.
      if (kDqBulk && tid == 0) v2_bulk_wait_read<1>();
      sm90::fence_async_shared();
      sm90::named_barrier_sync(kV2DsBarrier, kV2Consumers);
      const uint64_t desc_ds = sm90::make_kmajor_desc(ds_tile, kV2Keys);
      float dq[D / 4];
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kV2Keys / 32; ++kk) {
        sm90::wgmma_ss<D / 2, false>(dq, v2_desc_at(desc_ds, kk), v2_desc_at(desc_kt, kk), kk > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      v2_fence(dv);
      v2_fence(dk);
      v2_fence(dq);
      v2_fence(pa);
      v2_fence(da);
      sm90::mbar_arrive(&sm.empty[s]);  // every consumer thread, as in the amax pass
      {  // the tile's dQ in real units (dq_acc sums tiles of different exponents)
        const Pow2 unit(-h_dq);
#pragma unroll
        for (int i = 0; i < D / 4; ++i) dq[i] = unit(dq[i]);
      }

      if constexpr (kDqBulk) {
        v2_add_dq_bulk<D>(p, tm_dq, sm, dq, it, cw, n, bh, mb);
      } else {
        int* turn = p.dq_turn + bh * (p.s_q_pad / kV2Queries) + mb;
        if (p.deterministic) v2_wait_turn(turn, n);
        float* acc = p.dq_acc + (bh * p.s_q + q0 + warp * 16 + g) * D + cw * (D / 2);
#pragma unroll
        for (int e = 0; e < D / 4; e += 2) {
          const int h8 = accum_row_half(e);
          if (q0 + warp * 16 + g + 8 * h8 < p.s_q) {
            float* a = acc + 8 * h8 * D + accum_col(e, t);
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(dq[e]),
                         "f"(dq[e + 1])
                         : "memory");
          }
        }
        if (p.deterministic) v2_pass_turn(turn);
      }
    }
  }
  if (kDqBulk && tid == 0) v2_bulk_wait_all();  // the staging reads, before the CTA ends
  const int last = (hk + 1) * group - 1;
  v2_store_kv<D>(p, dk, dv, -e_acc, u_dv(last), bb, hk, n0 + key_l, t);
}

// DSource::kHighPrecisionO, amax pass: D_hp_i += sum over the CTA's 128 keys of p_ij dP_ij (the p
// and dP of dS: P masked, dP * 2^-g'; pv holds 2^8 p, the sum is scaled back exactly), one add per
// query row and CTA, from the warpgroup that ran the step (both tiles of 64 keys). Per thread, the
// two tiles' two row halves of each of its 16 columns; a reduce-scatter over the 8 lanes of each
// column leaves lane (g, t) the columns d_hp_col(g, t, 0 / 1) (bwd_bits.h, CPU-tested); the 4
// warps' sums meet in shared memory (the unused dS tile: per warpgroup, by the parity of its own
// step count, a buffer being rewritten two of its steps later, after its readers passed the
// barrier of the step between) and 64 threads add them in warp order. Deterministic: the adds of
// a query block in key-block order (turns on dsum_hp_turn).
template <int D>
__device__ __forceinline__ void v2_add_d_hp(const BwdParams& p, V2Smem<D, true>& sm,
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
  v2_halve<8>(v, lane, 16);
  v2_halve<4>(v, lane, 8);
  v2_halve<2>(v, lane, 4);
  static_assert(sizeof(float) * 2 * 2 * 4 * kV2Queries <= sizeof(V2Smem<D, true>::ds));
  auto red = reinterpret_cast<float(*)[2][4][kV2Queries]>(&sm.ds[0][0]);
  *reinterpret_cast<float2*>(&red[cw][local & 1][warp][d_hp_col(g, t, 0)]) =
      make_float2(v[0], v[1]);
  v2_wg_sync<kV2DsBarrier>(cw);
  int* turn =
      p.dsum_hp_turn != nullptr ? p.dsum_hp_turn + bh * (p.s_q_pad / kV2Queries) + mb : nullptr;
  if (turn != nullptr) {
    if (tid == 0) {
      int x;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(x) : "l"(turn) : "memory");
      } while (x != n);
    }
    v2_wg_sync<kV2DqBarrier>(cw);
  }
  const int i = mb * kV2Queries + tid;
  if (tid < kV2Queries && i < p.s_q) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) sum += red[cw][local & 1][w][tid];
    sum *= 1.f / float(1 << kPLiftLog2);  // pv is 2^8 p
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p.dsum_hp + bh * p.s_q + i), "f"(sum)
                 : "memory");
  }
  if (turn != nullptr) {
    __threadfence();
    v2_wg_sync<kV2DqBarrier>(cw);
    if (tid == 0) atomicAdd(turn, 1);
  }
}

// Amax pass, consumer warpgroup cw: D_hp (DSource::kHighPrecisionO, the only case that runs it
// since dS's scales are per tile: its name is from when it also found their per-head maxima, and
// v1's amax pass still does). The two warpgroups take alternate steps
// (cw: the steps it with it % 2 == cw), each over all 128 keys (two 64-key tiles), so that they
// run out of phase: one's element work under the other's wgmmas (in the gradient pass they share
// every step through dQ).
template <int D, int kP>
__device__ __forceinline__ void v2_consume_amax(const BwdParams& p, V2Smem<D, true>& sm, int cw,
                                                int bb, int hk, int n, int mb_begin, int mb_end) {
  constexpr int kStages = V2Smem<D, true>::kStages;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n0 = n * kV2Keys;
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
      const int s = v2_stage<kStages>(it);
      const int q0 = mb * kV2Queries;
      const uint64_t desc_q = sm90::make_kmajor_desc(sm.st[s].q, D);
      const uint64_t desc_dov = sm90::make_kmajor_desc(sm.st[s].dov, D);
      float sc[2][32], dp[2][32];
      sm90::mbar_wait(&sm.full[s], v2_parity<kStages>(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int kk = 0; kk < D / 32; ++kk) {
          sm90::wgmma_ss<64, false>(sc[r], v2_desc_at(desc_k[r], kk), v2_desc_at(desc_q, kk),
                                    kk > 0);
        }
      }
      sm90::wgmma_commit();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int kk = 0; kk < D / 32; ++kk) {
          sm90::wgmma_ss<64, true>(dp[r], v2_desc_at(desc_v[r], kk), v2_desc_at(desc_dov, kk),
                                   kk > 0);
        }
      }
      sm90::wgmma_commit();

      const float qs = sm.q_scale[s];
      const V2Mask mask[2] = {v2_mask(p, n0 + warp * 16 + g, q0),
                              v2_mask(p, n0 + 64 + warp * 16 + g, q0)};
      sm90::wgmma_wait<1>();
      v2_fence(sc[0]);
      v2_fence(sc[1]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        v2_p_step<kP>(sc[r], mask[r], sm.lse2[s], sm.pscale[s],
                      v2_score_factor<kP>(qs, ks, p.scale_log2), t,
                      v2_direct_pair(sm, cw, 2 * (local & 1) + r));
      }
      v2_fence(sc[0]);  // P is computed here, while the dP^T wgmmas run, not after their wait
      v2_fence(sc[1]);
      sm90::wgmma_wait<0>();
      v2_fence(dp[0]);
      v2_fence(dp[1]);
      // dP as dS and D_hp see it (2^-g' undone).
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
      // warpgroup that ran the step arrives (v2_empty_arrivals), each releasing its own loads.
      sm90::mbar_arrive(&sm.empty[s]);
      // D_hp (DSource::kHighPrecisionO): a uniform branch, not taken for kForwardO.
      if (p.dsum_hp != nullptr) v2_add_d_hp<D>(p, sm, sc, dp, local, cw, n, bh, mb);
      ++local;
    }
  }
}

template <int D, bool kAmax, bool kDqBulk, int kP>
__global__ void __launch_bounds__(kV2Threads, 1)
    bwd_main_v2_kernel(const __grid_constant__ BwdV2Params P) {
  const BwdParams& p = P.p;
  extern __shared__ uint8_t smem_raw[];
  // Aligned to 1024 (the 128-byte swizzle's period) by pointer arithmetic on the shared array, so
  // that the compiler keeps shared-memory instructions (a detour through an integer made every
  // access generic).
  auto& sm = *reinterpret_cast<V2Smem<D, kAmax>*>(smem_raw +
                                                  ((1024u - sm90::smem_addr(smem_raw)) & 1023u));
  const int n = int(blockIdx.x % unsigned(p.key_blocks));
  const int bhk = int(blockIdx.x / unsigned(p.key_blocks));  // batch * h_kv + kv head
  const int bb = bhk / p.h_kv, hk = bhk % p.h_kv;
  const int n0 = n * kV2Keys;
  const int mb_begin = int(first_query_block(n0, p.s_q, p.s_k, p.causal, kV2Queries));
  const int mb_end = p.s_q_pad / kV2Queries;

  if (threadIdx.x == 0) {
    for (int s = 0; s < V2Smem<D, kAmax>::kStages; ++s) {
      sm90::mbar_init(&sm.full[s], kV2FullArrivals);
      sm90::mbar_init(&sm.empty[s], v2_empty_arrivals(kAmax));
    }
    sm90::fence_barrier_init();
  }
  v2_load_kv<D, kAmax>(p, sm, bhk, n0);
  sm90::fence_async_shared();  // the generic-proxy tile writes, before wgmma reads them
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::setmaxnreg_dec<24>();
    if (threadIdx.x < 32) v2_produce<D, kAmax, kP>(P, sm, bb, hk, mb_begin, mb_end);
  } else {
    sm90::setmaxnreg_inc<240>();
    if constexpr (kAmax) {
      v2_consume_amax<D, kP>(p, sm, wg - 1, bb, hk, n, mb_begin, mb_end);
    } else {
      v2_consume<D, kDqBulk, kP>(p, &P.tm_dq, sm, wg - 1, bb, hk, n, mb_begin, mb_end);
    }
  }
}

}  // namespace fp4attn::bwd
