// Tiles, shared memory and parameters of the backward's v2 main kernel (main_v2_kernel.cuh,
// docs/kernels/bwd_sm90.md "v2"): every wgmma operand is K-major in shared memory with the
// swizzle of its row width (TMA's and the wgmma descriptor's pattern), written either by TMA or
// by the kernel itself through swizzle_offset.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_params.h"

namespace fp4attn::bwd {

constexpr int kV2Stages = 2;         // query-block stages (Q, dO_v, dO_t, Q_t, LSE, D)
constexpr int kV2Threads = 384;      // producer warpgroup + two consumer warpgroups
constexpr int kV2Consumers = 256;    // threads of the two consumer warpgroups
constexpr int kV2FullArrivals = 32;  // the producer warp: LSE / D rows, then TMA bytes (lane 0)
// Every consumer thread arrives on a stage's empty barrier: each one's arrive (release) orders
// its own plain loads of the stage's LSE / D rows before the producer warp's stores that refill
// them (one arrive per warp after __syncwarp relied on bar.warp.sync + cumulativity, which
// compute-sanitizer racecheck does not follow: docs/kernels/bwd_sm90.md, "racecheck (session 6)").
constexpr int kV2EmptyArrivals = kV2Consumers;
// dQ through bulk reductions (BwdParams::dq_bulk): each consumer warpgroup stages its FP32 dQ
// tile (64 queries x D / 2 channels) in boxes of 64 query rows x 32 channels (128 bytes, swizzled
// as CU_TENSOR_MAP_SWIZZLE_128B) and one thread adds them into dq_acc by TMA reduce-add.
constexpr int kV2DqBoxCols = 32;
constexpr int kV2DqBoxBytes = kV2Queries * kV2DqBoxCols * 4;

// Byte offset of (row, col) in a K-major tile of `row_bytes` (32, 64 or 128) bytes per row,
// swizzled as TMA's CU_TENSOR_MAP_SWIZZLE_{32,64,128}B and the wgmma descriptor's modes: the
// 16-byte chunk index (address bits 4..) XOR the 128-byte line index (bits 7..), both masked to
// row_bytes / 16 - 1. The tile must be aligned to 8 * row_bytes.
FP4ATTN_HD constexpr uint32_t swizzle_offset(uint32_t row, uint32_t col, uint32_t row_bytes) {
  const uint32_t off = row * row_bytes + col;
  return off ^ (((off >> 7) & (row_bytes / 16 - 1)) << 4);
}

template <int D>
struct alignas(1024) V2Smem {
  // Once per CTA: K [key][channel] and V [key][channel] (rows of D bytes), K^T [channel][key]
  // (rows of 128 bytes).
  uint8_t k[kV2Keys * D];
  uint8_t v[kV2Keys * D];
  uint8_t kt[D * kV2Keys];
  // dS_k [query][key] (E4M3(2^h dS k_scale)), one per parity of the step: the A operand of dQ.
  uint8_t ds[2][kV2Queries * kV2Keys];
  // Per query block, by TMA: Q and dO_v [query][channel], dO_t and Q_t [channel][query position]
  // (rows of 64 bytes).
  struct Stage {
    uint8_t q[kV2Queries * D];
    uint8_t dov[kV2Queries * D];
    uint8_t dot[D * kV2Queries];
    uint8_t qt[D * kV2Queries];
  } st[kV2Stages];
  // dQ staging by step parity (dq_bulk): [box of 32 channels][query row][channel], swizzled; the
  // reduce of step it reads buffer it % 2 while step it + 1 writes the other.
  alignas(1024) uint8_t dq[2][D / kV2DqBoxCols][kV2DqBoxBytes];
  float lse2[kV2Stages][kV2Queries];  // LSE * log2 e - kPLiftLog2 (+inf past s_q)
  float dsum[kV2Stages][kV2Queries];  // D (0 past s_q)
  uint64_t full[kV2Stages];
  uint64_t empty[kV2Stages];
};

template <int D>
constexpr int v2_smem_bytes() {
  return int(sizeof(V2Smem<D>)) + 1024;  // + slack to align the dynamic base to 1024
}
static_assert(v2_smem_bytes<128>() <= 227 * 1024, "v2: over sm_90's 227 KB per CTA");
static_assert(v2_smem_bytes<64>() <= 227 * 1024, "v2: over sm_90's 227 KB per CTA");

// The kernel's parameters: v1's, and the TMA maps of the per-query-block tiles (3-D, innermost
// first): Q (d, s_q, b*h), dO_v (d, s_q_pad, b*h), dO_t and Q_t (s_q_pad, d, b*h); the gradient
// pass with dq_bulk: dq_acc (d, s_q, b*h) FP32, boxes (32, 64, 1) (rows past s_q are not added).
struct BwdV2Params {
  CUtensorMap tm_q;
  CUtensorMap tm_dov;
  CUtensorMap tm_dot;
  CUtensorMap tm_qt;
  CUtensorMap tm_dq;
  BwdParams p;
};

}  // namespace fp4attn::bwd
