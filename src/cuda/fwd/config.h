// The Hopper forward kernel's tiles, pipeline depth, shared memory and its one tile-size choice
// (fwd_wide_block), shared by the launcher (host) and the kernel.
#pragma once

#include <cstdint>

#include "cuda/fwd/p_mode.h"

namespace fp4attn::sm90 {

constexpr int kBlockM = 128;     // query rows per CTA: two consumer warpgroups of 64
constexpr int kScaleTile = 128;  // tokens per Q/K scale (operands.h kOperandTileTokens)
constexpr int kStages = 4;       // K/V shared-memory stages (32 KB each)
constexpr int kThreads = 384;    // producer warpgroup + two consumer warpgroups

// The code map's denominator is the sum of the rounded P, which the PV MMA computes through 8
// rows of ones appended to each V^T box (N = d + 8) instead of one FADD per score element.
template <int PM>
constexpr bool ones_sum() {
  return PM == kPCodes;
}
template <int PM>
constexpr int ones_bytes() {
  return ones_sum<PM>() ? 8 * 128 : 0;  // 8 rows of 128 keys of E4M3 1.0 per V^T box
}

// Keys per pipeline stage (N, a template parameter): 128 at d = 128, where a 64 x 256 S does not
// fit the registers beside O and P. At d = 64 both (bench/scripts/fwd-variants,
// docs/kernels/fwd_sm90.md): 256 halves the per-block overhead (27% faster non-causal at s =
// 4096-16384), 128 wastes less past the causal diagonal (5-35% faster causal at s <= 4096);
// fwd_wide_block() picks. 256 spills 76 bytes in the persistent loop, which costs less than it
// saves.
constexpr int kNarrowN = 128;
constexpr int kWideN = 256;
inline bool fwd_wide_block(int d, bool causal, int64_t s_k) {
  return d == 64 && (!causal || s_k >= 8192);
}

template <int D, int PM, int N>
struct alignas(1024) FwdSmem {
  uint8_t q[kBlockM * D];
  uint8_t k[kStages][N * D];
  uint8_t v[kStages][N / kScaleTile][D * kScaleTile + ones_bytes<PM>()];  // V^T in 128-key boxes
  // Output staging per consumer warpgroup: D / 64 boxes of 64 rows x 128 bytes, 128-byte swizzle.
  uint8_t out[2][64 * D * 2];
  uint64_t q_full;
  uint64_t q_empty;  // both consumer warpgroups are done reading Q
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

template <int D, int PM, int N>
constexpr int fwd_smem_bytes() {
  return sizeof(FwdSmem<D, PM, N>) + 1024;  // + slack to align the dynamic base to 1024
}

}  // namespace fp4attn::sm90
