// The paged decode kernel's shape: CTA size, tiles, the register budget per form and format
// (kDecodeMinBlocks), the NVFP4 ring's depth and the shared memory a launch needs, shared by the
// launcher (decode.cu, host) and the kernel.
#pragma once

#include <cstddef>

#include "cuda/decode/decode_bits.h"

namespace fp4attn::paged {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeRows = 16;  // MMA M: query rows of a row block
constexpr int kDecodeTile = 16;  // keys per warp tile
// CTAs per SM the register allocation must allow (__launch_bounds__). The 16-row form: d = 64: 4
// (<= 128 registers); d = 128: 2 (FP8: its raw tiles are twice as large, 3 would spill; NVFP4: 3
// (<= 168 registers) spills in the loop and was measured slower, 1.03 ms against 0.77 ms at
// b = 32, L = 32k). The transposed form (kT, <= 8 rows) holds half the Q and O fragments (d/16 x 2
// and d/16 x 4 registers instead of d/16 x 4 and d/8 x 4): NVFP4 d = 128 fits 4 CTAs (<= 128
// registers, no spill, the next tile's loads still ahead of this tile's MMAs); FP8 d = 128 spills
// at 4 and takes 3 (<= 168).
template <int D, bool kFp4, bool kT = false>
constexpr int kDecodeMinBlocks = kT ? (D == 64 ? 4 : (kFp4 ? 4 : 3)) : (D == 64 ? 4 : 2);
// Query rows of a row block: the MMA's M (16) in the 16-row form, its N (8) in the transposed one.
template <bool kT>
constexpr int kBlockRows = kT ? 8 : kDecodeRows;
// Q's registers per k-step: the 16-row form's A fragment (rows g, g + 8), the transposed form's B
// fragment (row g).
template <bool kT>
constexpr int kQRegs = kT ? 2 : 4;

// NVFP4: each warp's shared-memory ring of kRingStages tiles (the stage layout and its lane maps
// are RingLayout, decode_bits.h, CPU-tested).
constexpr int kRingStages = 4;
template <int D>
struct Ring : RingLayout<D> {
  static constexpr int kWarpBytes = kRingStages * RingLayout<D>::kStage;
};

// Shared memory of the warp merge: per warp kRows rows of O, row stride d + 8 floats, element
// (row, n-tile, column) at row * (d + 8) + 8 n + column (channel (d/8) column + n): the stores of
// the accumulators and the loads of the merge are (nearly) free of bank conflicts.
template <int D>
constexpr int kORowStride = D + 8;
// NVFP4 kernels also hold the warps' rings (before the merge, in the same space).
template <int D, bool kT = false, bool kFp4 = false>
constexpr size_t decode_smem_bytes() {
  constexpr int kRows = kBlockRows<kT>;
  constexpr size_t merge =
      sizeof(float) * (kDecodeWarps * kRows * kORowStride<D> + 2 * kDecodeWarps * kRows);
  constexpr size_t ring = kFp4 ? size_t{kDecodeWarps} * Ring<D>::kWarpBytes : 0;
  return merge > ring ? merge : ring;
}

// The splits a fused launch may have: the last arriver keeps a row block's LSEs (then weights),
// maxima and sums in the kernel's shared memory, kRows x (splits + 2) floats.
template <int D, bool kT, bool kFp4>
constexpr int kFusedMaxSplits =
    static_cast<int>(decode_smem_bytes<D, kT, kFp4>() / sizeof(float) / kBlockRows<kT> - 2);

}  // namespace fp4attn::paged
