// What the main kernel's roles share: the named barriers' ids, the spin on a deterministic turn,
// the wgmma k-step loops, the stage ring's indices, register fences, and a consumer step's mask
// and column pairs.
#pragma once

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/main_layout.h"
#include "cuda/bwd/params.h"
#include "cuda/sm90/ptx.cuh"
#include "cuda/sm90/wgmma_fp8.cuh"

namespace fp4attn::bwd {

// Named barriers (0 is __syncthreads). Gradient pass: both consumer warpgroups' dS bytes are in
// shared memory (kDsBarrier, 256 threads); consumer warpgroup cw's dQ tile is staged
// (kDqBarrier + cw); the tile max of |dS| (both warpgroups). D_hp pass: warpgroup cw's row sums
// (kDsBarrier + cw) and its deterministic turn (kDqBarrier + cw).
constexpr int kDsBarrier = 1;       // and 2: per consumer warpgroup in the D_hp pass
constexpr int kDqBarrier = 3;       // and 4: per consumer warpgroup
constexpr int kTileMaxBarrier = 5;  // the gradient pass's tile max of |dS| (both warpgroups)
// fp4-direct: the 32-key block maxima meet per warp pair (warps 2k, 2k + 1 of warpgroup cw) on
// barrier kPairBarrier + 2 cw + k, 64 threads.
constexpr int kPairBarrier = 6;

// Barrier kBase + cw over warpgroup cw's 128 threads. The id is an immediate, so that ptxas
// counts the barriers the kernel names, not all 16.
template <int kBase>
__device__ __forceinline__ void wg_sync(int cw) {
  if (cw == 0) {
    asm volatile("bar.sync %0, 128;" ::"n"(kBase) : "memory");
  } else {
    asm volatile("bar.sync %0, 128;" ::"n"(kBase + 1) : "memory");
  }
}

// Spins until the deterministic turn counter reaches `want` (acquire: the earlier key blocks'
// adds are visible after it).
__device__ __forceinline__ void wait_turn(const int* turn, int want) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
  } while (v != want);
}

// The descriptor of k-step kk (32 bytes further, 2 in the start-address field): added to the low
// word only (the field is 14 bits of a shared-memory address below 2^18: it cannot carry), which
// saves the 64-bit add and its moves before every wgmma.
__device__ __forceinline__ uint64_t desc_at(uint64_t desc, int kk) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + 2u * uint32_t(kk));
}

// acc (N columns) = A B^T over kSteps k-steps of 32 (wgmma ss, both descriptors stepped by
// desc_at); the caller fences and commits.
template <int N, bool kBE5m2, int kSteps>
__device__ __forceinline__ void gemm_ss(float (&acc)[N / 2], uint64_t a, uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    sm90::wgmma_ss<N, kBE5m2>(acc, desc_at(a, kk), desc_at(b, kk), kk > 0);
  }
}
// acc (N columns) += A B^T over two k-steps, A (two k-steps of 32) from registers.
template <int N, bool kBE5m2>
__device__ __forceinline__ void gemm_rs(float (&acc)[N / 2], const uint32_t (&a)[2][4],
                                        uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) sm90::wgmma_rs<N, kBE5m2>(acc, a[kk], desc_at(b, kk), 1);
}

// Step `it` of the CTA's (head, query block) sequence in the stage ring.
template <int kStages>
__device__ __forceinline__ int stage_of(int it) {
  return it % kStages;
}
template <int kStages>
__device__ __forceinline__ uint32_t parity_of(int it) {
  return uint32_t(it / kStages) & 1u;
}

// sm90::fence_regs of an accumulator or of the two k-steps of a packed A operand: their values
// stay on their side of the wgmma issue and wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
  sm90::fence_regs(r);
}
__device__ __forceinline__ void reg_fence(uint32_t (&a)[2][4]) {
  sm90::fence_regs(a[0]);
  sm90::fence_regs(a[1]);
}

// Element e (row half h) of a consumer thread's step is visible iff lo[h] <= its local query
// column < hi[h]: the mask of key_visible (tails of both lengths, bottom-right causal) in two
// compares. `full` (warp-uniform): every element of the warp is visible (all steps but the causal
// diagonal and the tails), and the loops skip the mask.
struct StepMask {
  int lo[2], hi[2];
  bool full;
  __device__ __forceinline__ bool visible(int e, int t) const {
    const int c = accum_col(e, t), h = accum_row_half(e);
    return c >= lo[h] && c < hi[h];
  }
};

// key: the thread's first key row (n0 + key_l); q0: the step's first query.
__device__ __forceinline__ StepMask step_mask(const BwdParams& p, int key, int q0) {
  StepMask m;
  const int q_lim = min(p.s_q - q0, kQueryBlock);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k = key + 8 * h;
    m.lo[h] = p.causal ? max(0, k - (p.s_k - p.s_q) - q0) : 0;
    m.hi[h] = k < p.s_k ? q_lim : 0;
  }
  m.full = __all_sync(0xffffffffu, m.lo[0] == 0 && m.lo[1] == 0 && m.hi[0] == kQueryBlock &&
                                       m.hi[1] == kQueryBlock);
  return m;
}

// The LSE / D pair of the columns 8j + 2t, 8j + 2t + 1 of elements 4j..4j + 3 (element e takes
// .x when e is even).
__device__ __forceinline__ float2 col_pair(const float* v, int j, int t) {
  return *reinterpret_cast<const float2*>(v + accum_col(4 * j, t));
}

}  // namespace fp4attn::bwd
