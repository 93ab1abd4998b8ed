// Tiles, shared memory and parameters of the backward's main kernel (main_kernel.cuh,
// docs/kernels/bwd_sm90.md): every wgmma operand is K-major in shared memory with the swizzle of
// its row width (TMA's and the wgmma descriptor's pattern), written either by TMA or by the
// kernel itself through swizzle_offset.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/params.h"

namespace fp4attn::bwd {

// Query-block stages (Q, dO_v, LSE, D, Q factor; dO_t, Q_t in the gradient pass): the gradient
// pass fits 2 beside its dS and dQ staging tiles; the D_hp pass loads half as much per step and
// computes 2 of the 5 GEMMs, so it keeps 4 steps in flight to hide the loads' latency.
constexpr int stage_count(bool dhp) { return dhp ? 4 : 2; }
// The size of a gradient-pass-only array: a 16-byte placeholder in the D_hp pass's layout.
constexpr int grad_only(bool dhp, int bytes) { return dhp ? 16 : bytes; }
constexpr int kMainThreads = 384;      // producer warpgroup + two consumer warpgroups
constexpr int kConsumerThreads = 256;  // threads of the two consumer warpgroups
constexpr int kFullArrivals = 32;      // the producer warp: LSE / D rows, then TMA bytes (lane 0)
// Every consumer thread arrives on a stage's empty barrier: each one's arrive (release) orders
// its own plain loads of the stage's LSE / D rows before the producer warp's stores that refill
// them (one arrive per warp after __syncwarp would rely on bar.warp.sync + cumulativity, which
// compute-sanitizer racecheck does not follow: docs/kernels/bwd_sm90.md, racecheck).
constexpr int kEmptyArrivals = kConsumerThreads;
// The D_hp pass's warpgroups take alternate steps: a stage is released by one warpgroup's 128.
constexpr int empty_arrivals(bool dhp) { return dhp ? kConsumerThreads / 2 : kEmptyArrivals; }
// dQ through bulk reductions: each consumer warpgroup stages its FP32 dQ tile (64 queries x D / 2
// channels) in boxes of 64 query rows x 32 channels (128 bytes, swizzled as
// CU_TENSOR_MAP_SWIZZLE_128B) and one thread adds them into dq_acc by TMA reduce-add.
constexpr int kDqBoxCols = 32;
constexpr int kDqBoxBytes = kQueryBlock * kDqBoxCols * 4;

// Byte offset of (row, col) in a K-major tile of `row_bytes` (32, 64 or 128) bytes per row,
// swizzled as TMA's CU_TENSOR_MAP_SWIZZLE_{32,64,128}B and the wgmma descriptor's modes: the
// 16-byte chunk index (address bits 4..) XOR the 128-byte line index (bits 7..), both masked to
// row_bytes / 16 - 1. The tile must be aligned to 8 * row_bytes.
FP4ATTN_HD constexpr uint32_t swizzle_offset(uint32_t row, uint32_t col, uint32_t row_bytes) {
  const uint32_t off = row * row_bytes + col;
  return off ^ (((off >> 7) & (row_bytes / 16 - 1)) << 4);
}

// The gradient pass's layout, and the D_hp pass's (kDhp: no K^T, dO_t, Q_t or dQ staging, whose
// arrays shrink to a placeholder; more stages).
template <int D, bool kDhp>
struct alignas(1024) MainSmem {
  static constexpr int kStages = stage_count(kDhp);
  // Once per CTA: K [key][channel] and V [key][channel] (rows of D bytes), K^T [channel][key]
  // (rows of 128 bytes).
  uint8_t k[kKeyBlock * D];
  uint8_t v[kKeyBlock * D];
  alignas(1024) uint8_t kt[grad_only(kDhp, D* kKeyBlock)];
  // dS_k [query][key] (E4M3(2^h dS k_scale)), one per parity of the step: the A operand of dQ
  // (the D_hp pass's row sums use it as scratch).
  alignas(1024) uint8_t ds[2][kQueryBlock * kKeyBlock];
  // Per query block, by TMA: Q and dO_v [query][channel], dO_t and Q_t [channel][query position]
  // (rows of 64 bytes).
  struct alignas(1024) Stage {
    uint8_t q[kQueryBlock * D];
    uint8_t dov[kQueryBlock * D];
    alignas(1024) uint8_t dot[grad_only(kDhp, D* kQueryBlock)];
    alignas(1024) uint8_t qt[grad_only(kDhp, D* kQueryBlock)];
  } st[kStages];
  // dQ staging by step parity: [box of 32 channels][query row][channel], swizzled; the
  // reduce of step it reads buffer it % 2 while step it + 1 writes the other.
  alignas(1024) uint8_t dq[2][D / kDqBoxCols][grad_only(kDhp, kDqBoxBytes)];
  float lse2[kStages][kQueryBlock];  // exp2: LSE * log2 e - kPLiftLog2 (+inf past s_q)
  float dsum[kStages][kQueryBlock];  // D (0 past s_q)
  float q_scale[kStages];            // the Q operand's factor of the step's 128-query tile
  // nvfp4-fast: 2^(120 + m - LSE log2 e) per query (lse2 then holds the code bias); fp4-direct:
  // 2^(2 - log2 6 + m - LSE log2 e) (lse2 holds m); main_p.cuh p_row_constants.
  float pscale[kStages][kQueryBlock];
  // fp4-direct: the 32-key block maxima per warp and query column, [warpgroup][buffer][warp]: by
  // step parity in the gradient pass, by (own step parity, 64-key tile) in the D_hp pass.
  float dslab[2][4][4][kQueryBlock];
  // Gradient pass: the 8 consumer warps' max |2^8 dS| (each lane its own slot), by step parity.
  float tile_max[2][8][32];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

template <int D, bool kDhp>
constexpr int main_smem_bytes() {
  return int(sizeof(MainSmem<D, kDhp>)) + 1024;  // + slack to align the dynamic base to 1024
}
static_assert(main_smem_bytes<128, false>() <= 227 * 1024, "over sm_90's 227 KB per CTA");
static_assert(main_smem_bytes<64, false>() <= 227 * 1024, "over sm_90's 227 KB per CTA");
static_assert(main_smem_bytes<128, true>() <= 227 * 1024, "over sm_90's 227 KB per CTA");
static_assert(main_smem_bytes<64, true>() <= 227 * 1024, "over sm_90's 227 KB per CTA");

// The kernel's parameters: BwdParams, and the TMA maps of the per-query-block tiles (3-D, innermost
// first): Q (d, s_q, b*h), dO_v (d, s_q_pad, b*h), dO_t and Q_t (s_q_pad, d, b*h); the gradient
// pass: dq_acc (d, s_q, b*h) FP32, boxes (32, 64, 1) (rows past s_q are not added).
struct MainParams {
  CUtensorMap tm_q;
  CUtensorMap tm_dov;
  CUtensorMap tm_dot;
  CUtensorMap tm_qt;
  CUtensorMap tm_dq;
  BwdParams p;
};

}  // namespace fp4attn::bwd
