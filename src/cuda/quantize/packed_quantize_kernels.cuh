// Kernels of the packed NVFP4 / MXFP4 quantizers (packed_quantize.cu).
//
// Work unit: 32 consecutive values of the logical [rows, d] matrix (two NVFP4 blocks or one
// MXFP4 block) per thread and grid-stride iteration: four 16-byte streaming loads, one 16-byte
// store of packed codes (8 bytes for the last unit of an odd NVFP4 block count) and one scale
// byte per block (a 16-bit store of both for even row-major scale buffers). The block amax is
// taken on the 16-bit inputs (packed VIMNMX.U16x2), exact and NaN-propagating as block_amax.
// 64-bit indexing throughout; strided inputs map rows with a multiplicative 64-bit division
// (packed::FastDiv).
//
// NVFP4 (packed_blocks.cuh nvfp4_block_vec / _46): the loads of the next grid-stride unit are
// issued before this unit's math; the block scale is computed with exact short sequences
// (div6_16bit, e4m3_code_*: verified against the reference on every input on the host) and
// s_enc / scale comes from a per-CTA shared table of the 127 scale codes; codes are packed by
// multiply-add (e2m1_pack8_magnitudes) and the signs taken from the input bits with PRMT. When
// s_enc * 512 overflows (s_enc / scale could be Inf), the fast kernel does nothing and
// nvfp4_reference_kernel (launched only when that can happen) quantizes every block with the
// reference function.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/quantize/half16_vectors.cuh"
#include "cuda/quantize/packed_blocks.cuh"
#include "cuda/quantize/packed_common.cuh"
#include "cuda/quantize/row_map.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/scale_layout.h"

namespace fp4attn::packed::quant {

constexpr int kThreads = 256;
constexpr int kUnit = 32;  // values per thread and iteration

struct QuantParams {
  const uint8_t* x;     // BF16/FP16 bytes
  int64_t units;        // ceil(rows * d / 32)
  int64_t blocks;       // rows * d / block
  int64_t sf_cols;      // d / block
  FastDiv div_sf_cols;  // blocks -> row
  FastDiv div_h16;      // 16-value halves -> row (d / 16)
  RowMap rows;
  bool contiguous;
  bool swizzled;
  bool scale_pairs;  // row-major scales at an even address: one 16-bit store per unit
  uint8_t* packed;
  uint8_t* scales;
  float s_enc;             // NVFP4: supplied value
  const float* s_enc_ptr;  // NVFP4: computed value in device memory (overrides s_enc)
  float* s_enc_out;        // NVFP4: receives the supplied value (null when computed)
};

// Byte offset in x of the 16-value half q (q = 2 * unit + k) of the logical [rows, d] matrix.
__device__ __forceinline__ int64_t half_offset(const QuantParams& p, int64_t q) {
  if (p.contiguous) return q * 32;
  const int64_t row = static_cast<int64_t>(p.div_h16.div(static_cast<uint64_t>(q)));
  const int64_t col = q - row * static_cast<int64_t>(p.div_h16.d);
  return (p.rows.offset(row) + col * 16) * 2;
}

__device__ __forceinline__ int64_t scale_offset(const QuantParams& p, int64_t g) {
  if (!p.swizzled) return g;
  const int64_t row = static_cast<int64_t>(p.div_sf_cols.div(static_cast<uint64_t>(g)));
  return swizzled_scale_offset(row, g - row * p.sf_cols, p.sf_cols);
}

// 16 values of one half and their amax (exact, NaN-propagating).
template <typename T>
__device__ __forceinline__ float half_values(const uint4& a, const uint4& b, float* x) {
  packed::unpack8<T>(a, x);
  packed::unpack8<T>(b, x + 8);
  uint32_t acc = 0;
  acc = packed::abs_max2(acc, a.x);
  acc = packed::abs_max2(acc, a.y);
  acc = packed::abs_max2(acc, a.z);
  acc = packed::abs_max2(acc, a.w);
  acc = packed::abs_max2(acc, b.x);
  acc = packed::abs_max2(acc, b.y);
  acc = packed::abs_max2(acc, b.z);
  acc = packed::abs_max2(acc, b.w);
  return __uint_as_float(packed::Half16<T>::abs16_to_f32_bits(packed::fold_max2(acc)));
}

// The four 16-byte vectors of unit u (the second half only when it exists).
__device__ __forceinline__ void load_unit(const QuantParams& p, int64_t u, uint4 (&v)[4]) {
  const uint8_t* src0 = p.x + half_offset(p, 2 * u);
  v[0] = packed::load16(src0);
  v[1] = packed::load16(src0 + 16);
  if (2 * u + 1 < p.blocks) {
    const uint8_t* src1 = p.contiguous ? src0 + 32 : p.x + half_offset(p, 2 * u + 1);
    v[2] = packed::load16(src1);
    v[3] = packed::load16(src1 + 16);
  } else {
    v[2] = v[3] = make_uint4(0, 0, 0, 0);
  }
}

template <typename T, Nvfp4ScaleRule kRule>
__device__ __forceinline__ uint32_t nvfp4_half(const uint4& a, const uint4& b, float s_enc,
                                               const float2* table, uint32_t (&w)[2]) {
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    return packed::nvfp4_block_vec_46<T>(a, b, s_enc, table, w);
  } else {
    return packed::nvfp4_block_vec<T, kRule>(a, b, s_enc, table, w);
  }
}

// Every block through the reference quantizer (s_enc so large that s_enc / scale can overflow).
// Launched after nvfp4_packed_kernel when s_enc is computed on the device or supplied that large;
// it does nothing when the table is finite.
template <typename T, Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(kThreads) nvfp4_reference_kernel(const QuantParams p) {
  const float s_enc = p.s_enc_ptr != nullptr ? *p.s_enc_ptr : p.s_enc;
  if (packed::nvfp4_table_finite(s_enc)) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < p.units;
       u += stride) {
    uint4 v[4];
    load_unit(p, u, v);
    const bool two = 2 * u + 1 < p.blocks;
    uint32_t w[4] = {0, 0, 0, 0};
    const uint32_t s0 = packed::nvfp4_block_reference_raw<T, kRule>(v[0], v[1], s_enc, w);
    __stcs(p.scales + scale_offset(p, 2 * u), static_cast<uint8_t>(s0));
    if (two) {
      const uint32_t s1 = packed::nvfp4_block_reference_raw<T, kRule>(v[2], v[3], s_enc, w + 2);
      __stcs(p.scales + scale_offset(p, 2 * u + 1), static_cast<uint8_t>(s1));
      __stcs(reinterpret_cast<uint4*>(p.packed + 16 * u), make_uint4(w[0], w[1], w[2], w[3]));
    } else {
      __stcs(reinterpret_cast<uint2*>(p.packed + 16 * u), make_uint2(w[0], w[1]));
    }
  }
}

// Quantizes and stores unit u from its four vectors.
template <typename T, Nvfp4ScaleRule kRule>
__device__ __forceinline__ void nvfp4_unit(const QuantParams& p, int64_t u, const uint4 (&v)[4],
                                           float s_enc, const float2* table) {
  const bool two = 2 * u + 1 < p.blocks;  // false only for the last unit of an odd count
  uint32_t lo[2], hi[2];
  const uint32_t s0 = nvfp4_half<T, kRule>(v[0], v[1], s_enc, table, lo);
  if (two) {
    const uint32_t s1 = nvfp4_half<T, kRule>(v[2], v[3], s_enc, table, hi);
    if (p.scale_pairs) {
      __stcs(reinterpret_cast<unsigned short*>(p.scales + 2 * u),
             static_cast<unsigned short>(s0 | (s1 << 8)));
    } else {
      __stcs(p.scales + scale_offset(p, 2 * u), static_cast<uint8_t>(s0));
      __stcs(p.scales + scale_offset(p, 2 * u + 1), static_cast<uint8_t>(s1));
    }
    __stcs(reinterpret_cast<uint4*>(p.packed + 16 * u), make_uint4(lo[0], lo[1], hi[0], hi[1]));
  } else {
    __stcs(p.scales + scale_offset(p, 2 * u), static_cast<uint8_t>(s0));
    __stcs(reinterpret_cast<uint2*>(p.packed + 16 * u), make_uint2(lo[0], lo[1]));
  }
}

// CTAs per SM the NVFP4 kernel is register-limited to (the most that ptxas fits without spills,
// see the table at the end of this file).
template <typename T, Nvfp4ScaleRule kRule>
constexpr int nvfp4_min_ctas() {
  if (kRule == Nvfp4ScaleRule::kFourOverSix) return 2;
  return std::is_same_v<T, __half> ? 4 : 5;
}

// Grid-stride loop with the next iteration's four loads issued before this one's math (64 bytes
// in flight per thread while it computes).
template <typename T, Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(kThreads, nvfp4_min_ctas<T, kRule>())
    nvfp4_packed_kernel(const QuantParams p) {
  __shared__ float2 table[128];
  const float s_enc = p.s_enc_ptr != nullptr ? *p.s_enc_ptr : p.s_enc;
  if (p.s_enc_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.s_enc_out = s_enc;
  packed::nvfp4_fill_scale_table(s_enc, table);
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (u >= p.units) return;
  if (!packed::nvfp4_table_finite(s_enc)) return;  // nvfp4_reference_kernel's case
  uint4 next[4];
  load_unit(p, u, next);
  for (; u < p.units; u += stride) {
    const uint4 v[4] = {next[0], next[1], next[2], next[3]};
    if (u + stride < p.units) load_unit(p, u + stride, next);
    nvfp4_unit<T, kRule>(p, u, v, s_enc, table);
  }
}

template <typename T, MxScaleRule kRule>
__global__ void __launch_bounds__(kThreads) mxfp4_packed_kernel(const QuantParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < p.units;
       u += stride) {
    uint4 v[4];
    const uint8_t* src = p.x + half_offset(p, 2 * u);  // d % 32 == 0: both halves in one row
    v[0] = packed::load16(src);
    v[1] = packed::load16(src + 16);
    v[2] = packed::load16(src + 32);
    v[3] = packed::load16(src + 48);
    float x[32];
    const float a0 = half_values<T>(v[0], v[1], x);
    const float a1 = half_values<T>(v[2], v[3], x + 16);
    // max of two non-negative (or NaN) floats by their bits: NaN-propagating.
    const float amax = __uint_as_float(max(__float_as_uint(a0), __float_as_uint(a1)));
    // Signs from the input bits wherever amax is finite and nonzero (not where the scale code
    // is: 0x00 is also the scale 2^-127 of tiny BF16 blocks, whose codes are signed).
    const uint32_t in[16] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w,
                             v[2].x, v[2].y, v[2].z, v[2].w, v[3].x, v[3].y, v[3].z, v[3].w};
    uint32_t w[4];
    const uint32_t s = packed::mxfp4_block_codes<kRule>(x, amax, in, w);
    __stcs(p.scales + scale_offset(p, u), static_cast<uint8_t>(s));
    __stcs(reinterpret_cast<uint4*>(p.packed + 16 * u), make_uint4(w[0], w[1], w[2], w[3]));
  }
}

// Zeroes the padding of a swizzled buffer: rows [rows, rows_pad) x all columns, then rows
// [0, rows) x columns [sf_cols, cols_pad).
__global__ void zero_swizzle_padding(uint8_t* scales, int64_t rows, int64_t sf_cols) {
  const int64_t rows_pad = (rows + 127) / 128 * 128, cols_pad = (sf_cols + 3) / 4 * 4;
  const int64_t n_rows = (rows_pad - rows) * cols_pad;
  const int64_t n = n_rows + rows * (cols_pad - sf_cols);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    if (i < n_rows) {
      r = rows + i / cols_pad;
      c = i % cols_pad;
    } else {
      const int64_t extra = cols_pad - sf_cols;
      r = (i - n_rows) / extra;
      c = sf_cols + (i - n_rows) % extra;
    }
    scales[swizzled_scale_offset(r, c, sf_cols)] = 0;
  }
}

__global__ void finalize_tensor_scale(float* s_enc, Nvfp4ScaleRule rule) {
  *s_enc = nvfp4_tensor_scale(*s_enc, rule);  // *s_enc holds the amax bits on entry
}

// Registers per thread (nvcc 13.0 -O3 -arch=sm_90a, ptxas -v; 0 spill stores/loads everywhere):
//   nvfp4_packed_kernel  nearest / round-up / restricted: 48 (BF16, 5 CTAs/SM), 63-64 (FP16, 4)
//                        four-over-six: 80 (3 CTAs/SM); no stack frame (no calls).
//   nvfp4_reference_kernel: 64-80 with the 80-byte frame of the out-of-line reference block.
//   mxfp4_packed_kernel: 32.  amax_kernel: 30.  dequant_kernel: 47-56.  repack kernels: 22-44.
// SASS of the NVFP4 hot loop (BF16, nearest, contiguous, row-major; cuobjdump -sass): per value
// 9 instructions (unpack, FMUL, 2 FMNMX, LOP3, FFMA, IMAD, LEA.HI / SHF for code and packing),
// per block of 16 ~45 (amax 21, scale code + table ~20, signs 4 PRMT + 2 LOP3), per unit of 32
// ~73 (addresses, prefetch, 16 moves of the prefetched vectors, stores): ~451 per 32 values,
// ~14 per value. Four-over-six: ~22-24 per value.
//   The MXFP4 hot loop: per value one unpack (IMAD.U32 / LOP3), FMUL, 2 FMNMX, LOP3, FFMA and
// ~6 integer ops for code, sign and nibble packing (~12 per value).

}  // namespace fp4attn::packed::quant
