// Kernels of the repack of packed storage into Q/K kernel operands (packed_repack.cu): bit-exact
// folds of the E2M1 codes, one thread per scale block, and the per-tile factors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/row_map.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/scale_layout.h"

namespace fp4attn::packed::repack {

constexpr int kThreads = 256;

struct RepackParams {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t blocks;
  int64_t sf_cols, block, d, s, h;
  FastDiv div_sf_cols, div_h, div_s;
  bool swizzled;
  uint8_t* data;        // E4M3 [b, h, s, d]
  unsigned* slice_max;  // MXFP4: per (b, h): 1 + largest non-NaN scale code, 0 if none
  float* scale;         // FP32 [b, h, tiles]
  int64_t tiles;
  float s_enc;
  const float* s_enc_ptr;
};

struct BlockPos {
  int64_t row, col, bh, si;
};

__device__ __forceinline__ BlockPos position(const RepackParams& p, int64_t g) {
  BlockPos q;
  q.row = static_cast<int64_t>(p.div_sf_cols.div(static_cast<uint64_t>(g)));
  q.col = g - q.row * p.sf_cols;
  const int64_t bs = static_cast<int64_t>(p.div_h.div(static_cast<uint64_t>(q.row)));
  const int64_t hi = q.row - bs * p.h;
  const int64_t bi = static_cast<int64_t>(p.div_s.div(static_cast<uint64_t>(bs)));
  q.si = bs - bi * p.s;
  q.bh = bi * p.h + hi;
  return q;
}

__device__ __forceinline__ uint8_t load_scale(const RepackParams& p, const BlockPos& q, int64_t g) {
  return p.scales[p.swizzled ? swizzled_scale_offset(q.row, q.col, p.sf_cols) : g];
}

__device__ __forceinline__ uint8_t* dst_of(const RepackParams& p, const BlockPos& q) {
  return p.data + (q.bh * p.s + q.si) * p.d + q.col * p.block;
}

// Grid-stride loop over the scale blocks: f(q, sc, g) for block g at position q with scale code
// sc.
template <typename F>
__device__ __forceinline__ void for_each_block(const RepackParams& p, F&& f) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < p.blocks;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const BlockPos q = position(p, g);
    f(q, load_scale(p, q, g), g);
  }
}

__global__ void __launch_bounds__(kThreads) nvfp4_fold_kernel(const RepackParams p) {
  for_each_block(p, [&](const BlockPos& q, uint8_t sc, int64_t g) {
    const uint2 w = *reinterpret_cast<const uint2*>(p.packed + 8 * g);
    const float f = e4m3_to_float(sc);
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? w.x : w.y;
      uint32_t o = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t c = static_cast<uint8_t>((word >> (16 * (k & 1) + 4 * i)) & 0xFu);
        const float prod = detail::mul_rn(e2m1_to_float(c), f);  // exact
        const uint8_t e =
            (sc & 0x7Fu) == 0x7Fu ? 0x7F : float_to_e4m3(detail::mul_rn(prod, 0.125f));
        o |= static_cast<uint32_t>(e) << (8 * i);
      }
      out[k] = o;
    }
    *reinterpret_cast<uint4*>(dst_of(p, q)) = make_uint4(out[0], out[1], out[2], out[3]);
  });
}

__global__ void __launch_bounds__(kThreads) mxfp4_slice_max_kernel(const RepackParams p) {
  for_each_block(p, [&](const BlockPos& q, uint8_t sc, int64_t) {
    if (sc != 0xFF) atomicMax(p.slice_max + q.bh, static_cast<unsigned>(sc) + 1u);
  });
}

__device__ __forceinline__ int fold_offset(unsigned slice_max) {
  return slice_max == 0 ? 0 : static_cast<int>(slice_max) - 1 - 127 - kOperandPow2FoldTop;
}

__global__ void __launch_bounds__(kThreads) mxfp4_fold_kernel(const RepackParams p) {
  for_each_block(p, [&](const BlockPos& q, uint8_t sc, int64_t g) {
    const uint4 w = *reinterpret_cast<const uint4*>(p.packed + 16 * g);
    const int t = fold_offset(p.slice_max[q.bh]);
    const int k = static_cast<int>(sc) - 127 - t;  // in [-248, 6]
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = words[j / 2];
      uint32_t o = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t c = static_cast<uint8_t>((word >> (16 * (j & 1) + 4 * i)) & 0xFu);
        const uint8_t e =
            sc == 0xFF ? 0x7F : float_to_e4m3(detail::scale_pow2(e2m1_to_float(c), k));
        o |= static_cast<uint32_t>(e) << (8 * i);
      }
      out[j] = o;
    }
    uint4* dst = reinterpret_cast<uint4*>(dst_of(p, q));
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  });
}

// scale[bh, tile]: 8 / s_enc (NVFP4) or 2^t (MXFP4).
__global__ void factor_kernel(const RepackParams p, int64_t n, bool nv) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (nv) {
      const float s_enc = p.s_enc_ptr != nullptr ? *p.s_enc_ptr : p.s_enc;
      p.scale[i] = detail::div_rn(8.f, s_enc);
    } else {
      p.scale[i] = detail::scale_pow2(1.f, fold_offset(p.slice_max[i / p.tiles]));
    }
  }
}

}  // namespace fp4attn::packed::repack
