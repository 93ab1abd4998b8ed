// The split-KV combine of the paged decode: the combine kernel (combine_partials_kernel, one
// launch after the decode kernel) and the decode kernel's fused combine (fused_combine: the last
// CTA of a group to finish its split merges the group, fused_combine_rows). Both merge in split
// order with the same arithmetic, so the two paths give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/decode/config.h"
#include "cuda/decode/params.h"

namespace fp4attn::paged {

// The combine of one row block's items (rows (row, head) pairs: row m0 + j of the (sequence,
// kv head) group) by the whole CTA. Per item and channel it is combine_partials_kernel's
// arithmetic in its order, so that the bits equal the two-kernel path's: the max folded in split
// order by the golden's rule, w_s = expf(lse_s - m), their sum in split order, each channel's sum
// of w_s O_s in split order (one FMA per split), acc / sum rounded to BF16, m + logf(sum). Only
// the spreading differs: every item's LSEs come in one parallel load, and a thread owns 4
// channels of one item (float4 loads, 16 splits in flight). The partials were written by other
// CTAs of this launch: L2 loads (.cg), never L1.
template <int D, bool kT>
__device__ __forceinline__ void fused_combine_rows(const CombineParams& c, int64_t q_begin, int hk,
                                                   int group, int m0, int rows, float* smem) {
  const int S = c.splits;
  float* s_w = smem;            // [rows][S]: LSEs, then weights
  float* s_m = s_w + rows * S;  // [rows]
  float* s_sum = s_m + rows;    // [rows]
  auto row_of = [&](int j) { return q_begin + (m0 + j) / group; };
  auto head_of = [&](int j) { return hk * group + (m0 + j) % group; };
  __syncthreads();  // the shared memory's previous use (the merge, an earlier row block) is over
  for (int idx = threadIdx.x; idx < rows * S; idx += kDecodeThreads) {
    const int j = idx / S, s = idx - j * S;
    s_w[idx] = __ldcg(c.lse_part + s * c.lp_s[0] + row_of(j) * c.lp_s[1] + head_of(j) * c.lp_s[2]);
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const float* w = s_w + threadIdx.x * S;
    float m = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < S; ++s) {
      const float x = w[s];
      if (!(x <= m)) m = x;  // takes a NaN
    }
    s_m[threadIdx.x] = m;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * S; idx += kDecodeThreads) {
    const float m = s_m[idx / S];
    if (m != -INFINITY) s_w[idx] = expf(s_w[idx] - m);
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const float* w = s_w + threadIdx.x * S;
    float sum = 0.f;
    if (s_m[threadIdx.x] != -INFINITY) {
#pragma unroll 8
      for (int s = 0; s < S; ++s) sum += w[s];
    }
    s_sum[threadIdx.x] = sum;
  }
  __syncthreads();
  constexpr int kQuads = D / 4;
  for (int idx = threadIdx.x; idx < rows * kQuads; idx += kDecodeThreads) {
    const int j = idx / kQuads, c4 = 4 * (idx - j * kQuads);
    const int64_t r = row_of(j);
    const int hq = head_of(j);
    const int64_t bi = c.s_q > 0 ? r / c.s_q : r, i = c.s_q > 0 ? r % c.s_q : 0;
    uint16_t* out = c.o + bi * c.o_sb + i * c.o_si + hq * c.o_sh + c4;
    const float m = s_m[j];
    if (m == -INFINITY) {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = 0;
      continue;
    }
    const float sum = s_sum[j];
    const float* w = s_w + j * S;
    const float* o_row = c.o_part + r * c.op_s[1] + hq * c.op_s[2] + c4;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // 16 splits' loads issued before their FMAs. The last chunk's loads past S re-read split
    // S - 1 and are not used: unpredicated loads stay in flight together (predicated ones ran
    // out of predicate registers and went in groups of 2-7).
    for (int s0 = 0; s0 < S; s0 += 16) {
      float4 v[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        v[k] = __ldcg(reinterpret_cast<const float4*>(o_row + min(s0 + k, S - 1) * c.op_s[0]));
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (s0 + k < S) {
          const float ws = w[s0 + k];
          acc[0] += ws * v[k].x;
          acc[1] += ws * v[k].y;
          acc[2] += ws * v[k].z;
          acc[3] += ws * v[k].w;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat16 h = __float2bfloat16_rn(acc[k] / sum);
      out[k] = *reinterpret_cast<const uint16_t*>(&h);
    }
  }
  if (threadIdx.x < rows && c.lse != nullptr) {
    const int64_t r = row_of(threadIdx.x);
    const int64_t bi = c.s_q > 0 ? r / c.s_q : r, i = c.s_q > 0 ? r % c.s_q : 0;
    const float m = s_m[threadIdx.x];
    c.lse[bi * c.l_sb + i * c.l_si + head_of(threadIdx.x) * c.l_sh] =
        m == -INFINITY ? INFINITY : m + logf(s_sum[threadIdx.x]);
  }
}

// The fused combine's arrival, once the CTA has written the partials of its row blocks (rb_first,
// then every row_blocks-th below num_rb): the last CTA of the group (sequence, kv head, row
// blocks) to arrive merges the group's splits into o / lse. The group's counter is its first
// item's; a group without items (no query rows) has nothing to merge. Uniform over the CTA.
template <int D, bool kT>
__device__ __forceinline__ void fused_combine(const DecodeParams& p, int64_t q_begin, int hk,
                                              int group, int rb_first, int num_rb, int rows_total,
                                              float* smem) {
  constexpr int kRows = kBlockRows<kT>;
  const int m_first = rb_first * kRows;
  if (m_first >= rows_total) return;
  // Arrive once this CTA's partials are visible device-wide: every thread's fence, then the
  // barrier, then one atomic (the last-arriver pattern).
  __threadfence();
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    int32_t* ctr = p.counters + (q_begin + m_first / group) * p.h + hk * group + m_first % group;
    last = atomicAdd(ctr, 1) == p.num_splits - 1;
    if (last) {
      atomicExch(ctr, 0);  // every other split has arrived: the next launch finds it zero
      __threadfence();     // the other CTAs' partials are read after their arrivals
    }
  }
  if (!__syncthreads_or(last)) return;
  // The merge's order is the split order, whichever CTA arrives last: deterministic.
  for (int rb = rb_first; rb < num_rb; rb += p.row_blocks) {
    const int m0 = rb * kRows;
    fused_combine_rows<D, kT>(p.comb, q_begin, hk, group, m0, min(kRows, rows_total - m0), smem);
  }
}

// One CTA per (row, head) item (grid-stride), the float64 combine's math in FP32 with its order
// of operations, so that its bits do not depend on how the work is spread: the max by the
// golden's sequential rule, the sum in split order, each channel's sum of w_s O_s in split order.
// The LSEs come in one parallel load, the weights are computed once per split into shared memory,
// and each thread owns one channel, its split loads independent of each other (unrolled): one
// warp per item with each lane looping over every split for each of its channels would run
// ~splits x d/32 dependent L2 round trips with only total_q x h warps in flight (at b = 1 and 64
// splits, 32 warps on 8 SMs for tens of microseconds).
constexpr int kCombineThreads = 128;
constexpr int kCombineSmemSplits = 1024;  // weights kept in shared memory; beyond, recomputed

__global__ void __launch_bounds__(kCombineThreads) combine_partials_kernel(const CombineParams p) {
  __shared__ float s_w[kCombineSmemSplits];
  const int64_t items = p.total_q * p.h;
  const int nsm = min(p.splits, kCombineSmemSplits);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t r = item / p.h;
    const int hq = static_cast<int>(item % p.h);
    const float* lse_row = p.lse_part + r * p.lp_s[1] + hq * p.lp_s[2];
    const float* o_row = p.o_part + r * p.op_s[1] + hq * p.op_s[2];
    __syncthreads();  // s_w of the previous item is consumed
    for (int s = threadIdx.x; s < nsm; s += kCombineThreads) s_w[s] = lse_row[s * p.lp_s[0]];
    __syncthreads();
    auto lse_at = [&](int s) { return s < nsm ? s_w[s] : lse_row[s * p.lp_s[0]]; };
    // Every thread folds the max itself, in split order (shared-memory broadcasts): the golden's
    // rule takes a NaN and restarts after it, an order-dependent fold.
    float m = -INFINITY;
    for (int s = 0; s < p.splits; ++s) {
      const float x = lse_at(s);
      if (!(x <= m)) m = x;  // takes a NaN
    }
    const int64_t bi = p.s_q > 0 ? r / p.s_q : r, i = p.s_q > 0 ? r % p.s_q : 0;
    uint16_t* out = p.o + bi * p.o_sb + i * p.o_si + hq * p.o_sh;
    if (m == -INFINITY) {  // uniform over the CTA
      for (int c = threadIdx.x; c < p.d; c += kCombineThreads) out[c] = 0;
      if (threadIdx.x == 0 && p.lse != nullptr) {
        p.lse[bi * p.l_sb + i * p.l_si + hq * p.l_sh] = INFINITY;
      }
      continue;
    }
    __syncthreads();  // every thread has read the LSEs
    for (int s = threadIdx.x; s < nsm; s += kCombineThreads) s_w[s] = expf(s_w[s] - m);
    __syncthreads();
    auto w_at = [&](int s) { return s < nsm ? s_w[s] : expf(lse_row[s * p.lp_s[0]] - m); };
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += w_at(s);
    for (int c = threadIdx.x; c < p.d; c += kCombineThreads) {
      float acc = 0.f;
      if (p.splits <= kCombineSmemSplits) {
        // Every weight in shared memory: no branch per split, so the unrolled loads are all in
        // flight together (with w_at's branch ptxas issued each load right before its FMA: one
        // L2 round trip per split, ~0.4 us). The same operations in the same order.
#pragma unroll 16
        for (int s = 0; s < p.splits; ++s) acc += s_w[s] * o_row[s * p.op_s[0] + c];
      } else {
#pragma unroll 16
        for (int s = 0; s < p.splits; ++s) acc += w_at(s) * o_row[s * p.op_s[0] + c];
      }
      const __nv_bfloat16 h = __float2bfloat16_rn(acc / sum);
      out[c] = *reinterpret_cast<const uint16_t*>(&h);
    }
    if (threadIdx.x == 0 && p.lse != nullptr) {
      p.lse[bi * p.l_sb + i * p.l_si + hq * p.l_sh] = m + logf(sum);
    }
  }
}

}  // namespace fp4attn::paged
