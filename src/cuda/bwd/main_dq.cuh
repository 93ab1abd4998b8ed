// The gradient pass's dQ: a consumer warpgroup's FP32 dQ tile of the step by wgmma over the
// block's 128 keys, then staged in shared memory and added into dq_acc by TMA reduce-add from one
// thread, in key-block turns when deterministic.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/main_common.cuh"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::bwd {

// Bulk-async helpers of the dQ reduce (the issuing thread's bulk group).
// dq_acc box (c0 channel, c1 query, c2 batch * head) += the swizzled FP32 box at src.
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, const void* src, int c0,
                                                  int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], "
      "[%1];" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(sm90::smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read_at_most() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Until every bulk group of this thread is complete (its global writes performed).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Orders this thread's generic-proxy global accesses with its async-proxy ones.
__device__ __forceinline__ void fence_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Warpgroup cw's dQ tile of the step (its channels, D / 2) = dS_k K over the block's 128 keys,
// issued and committed (wgmma ss: the A operand is the dS_k tile both warpgroups wrote, the B
// operand the warpgroup's half of K^T). Both warpgroups' dS bytes (generic-proxy writes) come
// before the wgmma reads them; the issuing thread first waits until the reduce of step it - 2 has
// read the dQ staging buffer that this step rewrites after the barrier.
template <int D>
__device__ __forceinline__ void issue_dq_gemm(float (&dq)[D / 4], const uint8_t* ds_tile,
                                              uint64_t desc_kt) {
  if (threadIdx.x % 128 == 0) bulk_wait_read_at_most<1>();
  sm90::fence_async_shared();
  sm90::named_barrier_sync(kDsBarrier, kConsumerThreads);
  const uint64_t desc_ds = sm90::make_kmajor_desc(ds_tile, kKeyBlock);
  sm90::wgmma_fence();
  gemm_ss<D / 2, false, kKeyBlock / 32>(dq, desc_ds, desc_kt);
  sm90::wgmma_commit();
}

// Warpgroup cw's dQ tile (query rows of the block x channels cw D / 2..) into the staging buffer
// of the step's parity, then one thread (the warpgroup's first) adds its D / 64 boxes into dq_acc
// by TMA reduce-add (rows past s_q are outside the map: not added). The other threads go on to
// the next step after the staging barrier; the buffer is rewritten two steps later, after the
// issuer's wait_group.read before that step's dS barrier.
// Deterministic: the issuer adds after key blocks 0..n-1 (a turn per query block and warpgroup,
// the warpgroups' channels being disjoint) and passes the turn once its adds are performed.
// dq: the tile in units of 2^-h_dq, brought to real units first (dq_acc sums tiles of different
// exponents).
template <int D>
__device__ __forceinline__ void add_dq(const BwdParams& p, const CUtensorMap* tm_dq,
                                       MainSmem<D, false>& sm, float (&dq)[D / 4], int h_dq, int it,
                                       int cw, int n, int64_t bh, int mb) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  {
    const Pow2 unit(-h_dq);
#pragma unroll
    for (int i = 0; i < D / 4; ++i) dq[i] = unit(dq[i]);
  }
  constexpr int kBoxes = D / 2 / kDqBoxCols;  // per warpgroup
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
        *reinterpret_cast<float2*>(at + box * kDqBoxBytes + h * 8 * 128) =
            make_float2(dq[e + 2 * h], dq[e + 2 * h + 1]);
      }
    }
  }
  sm90::fence_async_shared();  // the generic-proxy writes, before the bulk reduce reads them
  // The issuer waits for the warpgroup's writes. Every warp syncs (warps 1-3 could only arrive):
  // compute-sanitizer racecheck does not model bar.arrive beside other named barriers and then
  // reports false hazards on them (bench/race_probe --tile-max-arrive; docs/kernels/bwd_sm90.md).
  wg_sync<kDqBarrier>(cw);
  if (tid == 0) {
    // Deterministic: this warpgroup's turn of the query block (the pointer formed at each use).
    auto turn = [&] { return p.dq_turn + (bh * (p.s_q_pad / kQueryBlock) + mb) * 2 + cw; };
    if (p.deterministic) {
      wait_turn(turn(), n);
      fence_async_global();  // the earlier key blocks' adds, before this thread's reduces
    }
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      tma_reduce_add_3d(tm_dq, stage + b * kDqBoxBytes, (cw * kBoxes + b) * kDqBoxCols,
                        mb * kQueryBlock, int(bh));
    }
    sm90::bulk_commit();
    if (p.deterministic) {
      bulk_wait_all();  // performed, not only read
      fence_async_global();
      __threadfence();
      atomicAdd(turn(), 1);
    }
  }
}

}  // namespace fp4attn::bwd
