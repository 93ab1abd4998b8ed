// The V main pass: v_operand_kernel, transpose and quantize one tile of tokens x channels per CTA
// into V^T rows (keys permuted as operands.h operand_v_key_at), through v_operand::quantize_v_tile.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_v_config.h"
#include "cuda/quantize/operand_v_unit.cuh"

namespace fp4attn::detail::v_operand {

// One CTA: a tile of T = 16384 / d tokens x d channels; thread = kCh adjacent channels x kTok
// consecutive tokens (kCh * kTok = 64), read straight from global memory into registers
// (kTok vector loads of 2 * kCh bytes, all in flight before the math), quantized by
// v_operand::quantize_v_tile, and written as kTok (or 2 kTok) bytes to each of its kCh V^T rows:
// the CTA writes T contiguous bytes of every row (full 128-byte lines).
// fp8: 64 registers a thread (4 CTAs an SM), the channel divisions being done once by
// v_fp8_finish_kernel; the others 78-80 (3 CTAs; nvfp4-all spills at 64).
template <VMode kMode>
constexpr int kMinBlocks = kMode == VMode::kFp8 ? 4 : 3;

template <VMode kMode, bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kMode>) v_operand_kernel(VParams p) {
  constexpr int kCh = v_operand::kTileCh<kMode>, kTok = v_operand::kTileTok<kMode>;
  constexpr int kW = kCh / 2;               // 32-bit words per token
  constexpr int kG = kD / kCh;              // threads per token row
  constexpr int kT = kThreads / kG * kTok;  // tokens per tile
  static_assert(kT == 16384 / kD && kG <= kThreads);
  constexpr int kBytesPerToken = kMode == VMode::kBf16 ? 2 : 1;
  constexpr int kWords = kTok * kBytesPerToken / 4;  // output words per channel row

  // blockIdx: head fastest (neighbouring CTAs read neighbouring bytes of x), then tile, batch.
  // (32-bit division: blockIdx.x, h and tiles are < 2^31.)
  const uint32_t h32 = static_cast<uint32_t>(p.h), tiles32 = static_cast<uint32_t>(p.tiles);
  const uint32_t bt = blockIdx.x / h32, hi = blockIdx.x - bt * h32;
  const uint32_t bi = bt / tiles32, ti = bt - bi * tiles32;
  const int64_t bh = int64_t{bi} * p.h + hi;
  // Thread -> (channel group cg, token group tg): a warp is kLt token groups x kLc channel
  // groups (channel groups fastest), so that one load instruction reads kLt tokens x kLc * 2 kCh
  // contiguous bytes (whole sectors) and one 16-byte store instruction (kCh = 4) writes
  // kLt * 16 = 64 contiguous bytes of each of kLc V^T rows (whole sectors), instead of 32 rows
  // x 16 bytes (half sectors, completed by other warps) with a whole warp along the channels.
  constexpr int kLc = 8, kLt = 32 / kLc;  // lanes along channels / tokens
  constexpr int kWc = kG / kLc;           // warps along the channels
  static_assert(kG % kLc == 0 && (kThreads / 32) % kWc == 0 && (kThreads / kG) % kLt == 0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int cg = (warp % kWc) * kLc + lane % kLc, tg = (warp / kWc) * kLt + lane / kLc;
  const int64_t tok0 = int64_t{ti} * kT + tg * kTok;  // first token of this thread
  if (tok0 >= p.pitch) return;                        // no V^T bytes to write (tail tile)
  const int64_t live64 = p.s - tok0;
  const int live = live64 > kTok ? kTok : (live64 < 0 ? 0 : static_cast<int>(live64));
  const uint16_t* xs =
      p.x + int64_t{bi} * p.stride_b + int64_t{hi} * p.stride_h + tok0 * p.stride_s + cg * kCh;

  // All kTok loads are issued before any math; the pointer walks the tokens (no 64-bit multiply
  // per load).
  uint32_t raw[kTok * kW];
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    if constexpr (kW == 2) {
      uint2 q = make_uint2(0, 0);
      if (i < live) q = __ldcs(reinterpret_cast<const uint2*>(xs));
      raw[i * 2] = q.x;
      raw[i * 2 + 1] = q.y;
    } else {
      uint32_t q = 0;
      if (i < live) q = __ldcs(reinterpret_cast<const unsigned int*>(xs));
      raw[i] = q;
    }
    xs += p.stride_s;
  }

  const int64_t chan0 = bh * kD + cg * kCh;
  uint32_t chan_amax[kCh];
#pragma unroll
  for (int j = 0; j < kCh; ++j) chan_amax[j] = 0;
  if constexpr (kMode == VMode::kFp8) {
    // One 16-byte load (chan0 is a multiple of kCh = 4; the scratch is cudaMallocAsync'd).
    static_assert(kCh == 4);
    const uint4 q = *reinterpret_cast<const uint4*>(p.chan_amax + chan0);
    chan_amax[0] = q.x;
    chan_amax[1] = q.y;
    chan_amax[2] = q.z;
    chan_amax[3] = q.w;
  }
  v_operand::VUnitStats st;
  if constexpr (kMode == VMode::kNvfp4) {
    st.tensor_scale = p.tensor_scale;
    if (p.tensor_scale == 0.f) st.slice_amax = p.slice_amax[bh];
  }
  if constexpr (kMode == VMode::kDirect) st.slice_fin = p.slice_fin[bh];

  uint32_t w[kCh * kWords];
  // fp8: chan_amax holds fp8_inv_code(amax) (v_fp8_finish_kernel), no division here.
  v_operand::quantize_v_tile<kMode, kF16, kCh, kTok, kMode == VMode::kFp8>(raw, live, chan_amax, st,
                                                                           w);

  // V^T key order (operands.h): permute inside each 16-token group before the stores (padding
  // was zeroed in natural order, so it stays 0 wherever it lands).
#pragma unroll
  for (int j = 0; j < kCh; ++j) {
#pragma unroll
    for (int g = 0; g < kTok / 16; ++g) {
      if constexpr (kBytesPerToken == 1) {
        v_operand::permute_keys16_bytes(w + j * kWords + 4 * g);
      } else {
        v_operand::permute_keys16_halves(w + j * kWords + 8 * g);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kCh; ++j) {
    uint8_t* row = static_cast<uint8_t*>(p.data) + ((chan0 + j) * p.pitch + tok0) * kBytesPerToken;
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      // 16-byte chunk k covers tokens tok0 + k * 16 / kBytesPerToken ...; pitch is a multiple
      // of 16 tokens and tok0 of kTok >= 16, so only whole 16-token groups can fall past it.
      if (tok0 + k * (16 / kBytesPerToken) < p.pitch) {
        // Plain (write-back) stores: the CTA's other token groups complete the 128-byte line
        // while it is still in L2 (no evict-first on partially written lines).
        *reinterpret_cast<uint4*>(row + 16 * k) =
            make_uint4(w[j * kWords + 4 * k], w[j * kWords + 4 * k + 1], w[j * kWords + 4 * k + 2],
                       w[j * kWords + 4 * k + 3]);
      }
    }
  }
  // (fp8: the scales come from v_fp8_finish_kernel.)
  if (kMode != VMode::kFp8 && ti == 0 && tg == 0) {
#pragma unroll
    for (int j = 0; j < kCh; ++j) {
      p.scale[chan0 + j] = v_operand::channel_scale<kMode>(chan_amax[j], st);
    }
  }
}

}  // namespace fp4attn::detail::v_operand
