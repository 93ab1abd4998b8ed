// Private fast paths of the Q/K operand kernels (operand_qk_*.cuh).
//
// * e4m3_code_hi_finite / e4m3x4_finite: float_to_e4m3 of finite floats by an FMA onto a magic
//   binade (as packed::e2m1_mag_term does for E2M1), for the fp8 recipe.
// * Fold tables: the folded operand byte E4M3(e2m1 * scale ...) depends only on the element's
//   E2M1 code and its block's scale code, so it is looked up: one 8-byte row per scale code (the
//   8 magnitudes' folded E4M3 codes, computed on the device with the exact expression of the
//   reference fold), and each element selects its byte with a PRMT (selector = magnitude bits),
//   then takes its sign by XOR (the fold is odd in the code: E4M3(-v) = E4M3(v) ^ 0x80, -0
//   included, for every finite block factor; non-finite factors are NaN scale codes, which the
//   caller replaces by 0x7F bytes as the reference does).
#pragma once

#include <cstdint>

#include "cuda/quantize/packed_common.cuh"  // packed::prmt
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/quantize/half16_vectors.cuh"
#endif

namespace fp4attn::operand_fast {

// float_to_e4m3(y) for finite y, as the code in bits 24..31 of the result (bits 0..23 zero).
// a = min(|y|, 448) (values in (448, 464) round to 448 anyway, larger ones saturate there);
// p = 2^floor(log2 max(a, 2^-6)) is a's binade (or the subnormal one), and M = a + p * 2^20 lies
// in the binade whose ulp is p / 8, the E4M3 quantum of a: the FMA's single RNE rounds a onto the
// E4M3 grid (ties to the even code). r = M - p * 2^20 is that E4M3 value (exact),
// and r * 2^-120 rebiases its exponent from FP32's 127 to E4M3's 7: its bits are the E4M3
// magnitude code << 20 (E4M3 subnormals j * 2^-9 become the FP32 subnormals j * 2^-129, whose bits
// are j << 20 as well). Four of them pack into a word with byte permutes (e4m3x4_finite).
FP4ATTN_HD uint32_t e4m3_code_hi_finite(float y) {
  const float a = fminf(fabsf(y), kE4m3Max);
  const float p = bits_float(float_bits(fmaxf(a, 0.015625f)) & 0x7F800000u);
  const float m = fmaf(p, 1048576.f, a);
  const float r = fmaf(p, -1048576.f, m);        // exact
  const float q = detail::mul_rn(r, 0x1p-120f);  // 2^-120: exact
  return (float_bits(q) << 4) | (float_bits(y) & 0x80000000u);
}

// The 8 folded bytes of one NVFP4 scale code sc: byte m = E4M3((e2m1(m) * f) / 8), f = E4M3(sc)
// (the reference fold's expression, golden_operands.cc / quantize_kernel).
FP4ATTN_HD uint64_t nvfp4_fold_row(uint32_t sc) {
  const float f = e4m3_to_float(static_cast<uint8_t>(sc));
  uint64_t row = 0;
  for (uint32_t m = 0; m < 8; ++m) {
    const uint8_t b = float_to_e4m3(
        detail::mul_rn(detail::mul_rn(e2m1_to_float(static_cast<uint8_t>(m)), f), 0.125f));
    row |= uint64_t{b} << (8 * m);
  }
  return row;
}

// MXFP4: byte m = E4M3(e2m1(m) * 2^k), k = block exponent - slice offset, k in [-248, 6]
// (row k + 248).
constexpr int kMxFoldMinK = -248, kMxFoldRows = 255;
FP4ATTN_HD uint64_t mxfp4_fold_row(int k) {
  uint64_t row = 0;
  for (uint32_t m = 0; m < 8; ++m) {
    const uint8_t b = float_to_e4m3(detail::scale_pow2(e2m1_to_float(static_cast<uint8_t>(m)), k));
    row |= uint64_t{b} << (8 * m);
  }
  return row;
}

// Bits 4i+3 = sign of x[i] (i < 8), other bits zero. Byte k of `odd` holds x[2k+1]'s top byte
// (sign at bit 8k+7 = bit 4(2k+1)+3), byte k of `even` x[2k]'s (moved down 4 bits to 8k+3).
FP4ATTN_HD uint32_t sign_nibbles_f8(const float* x) {
  const uint32_t e01 = packed::prmt(float_bits(x[0]), float_bits(x[2]), 0x0073u);
  const uint32_t e23 = packed::prmt(float_bits(x[4]), float_bits(x[6]), 0x7300u);
  const uint32_t o01 = packed::prmt(float_bits(x[1]), float_bits(x[3]), 0x0073u);
  const uint32_t o23 = packed::prmt(float_bits(x[5]), float_bits(x[7]), 0x7300u);
  const uint32_t even = packed::prmt(e01, e23, 0x7610u);
  const uint32_t odd = packed::prmt(o01, o23, 0x7610u);
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// Sign bytes for the fold of magnitudes (fold8_mag): bit 7 of byte k = sign of element k of
// four 16-bit values (words w0 = elements 0, 1 and w1 = 2, 3): their high bytes, one PRMT.
FP4ATTN_HD uint32_t sign_bytes4_16(uint32_t w0, uint32_t w1) {
  return packed::prmt(w0, w1, 0x7531u);
}

// The same for four floats (their top bytes).
FP4ATTN_HD uint32_t sign_bytes4_f32(const float* x) {
  const uint32_t a = packed::prmt(float_bits(x[0]), float_bits(x[1]), 0x0073u);
  const uint32_t b = packed::prmt(float_bits(x[2]), float_bits(x[3]), 0x0073u);
  return packed::prmt(a, b, 0x5410u);
}

// Eight E2M1 magnitudes (element i in bits 4i..4i+2, bit 4i+3 zero) -> eight folded bytes through
// the row (t0: magnitudes 0..3, t1: 4..7): the magnitude nibbles are PRMT selectors as they are.
// Signs: bit 7 of the bytes of s0 (elements 0..3) / s1 (4..7), kept where smask has them
// (0x80808080, or 0 where the block's codes are all +0: NVFP4 scale code 0, MXFP4
// !packed::mxfp4_block_signed(amax)). E4M3 is odd in the folded value (-0 included), so the sign
// is an XOR.
FP4ATTN_HD void fold8_mag(uint32_t mag, uint32_t t0, uint32_t t1, uint32_t s0, uint32_t s1,
                          uint32_t smask, uint32_t& o0, uint32_t& o1) {
  o0 = packed::prmt(t0, t1, mag) ^ (s0 & smask);
  o1 = packed::prmt(t0, t1, mag >> 16) ^ (s1 & smask);
}

// One MXFP4 operand block (quantize_kernel, operand_qk_mx_bf16.cuh): the 32 values v (plain
// inputs, or smoothed differences x - mean) with amax = block_amax(v), slice offset t -> the 32
// folded bytes o (element 4i + k in byte k of o[i]): E4M3(e2m1_i * 2^(scale - 127 - t)) with
// (scale, e2m1) = mxfp4_quantize_block(v, kRoundUp), every byte 0x7F for a NaN/Inf block. Returns
// the scale code. row(i) returns fold row i (mxfp4_fold_row(i + kMxFoldMinK); the device reads
// its table). Signs from v's top bytes (the code of v_i has v_i's sign, -0 included) wherever
// packed::mxfp4_block_signed(amax): not where the scale code is nonzero, as 0x00 is also the
// scale 2^-127 of nonzero blocks.
template <typename RowFn>
FP4ATTN_HD uint32_t mxfp4_operand_block(const float (&v)[kMxfp4Block], float amax, int t,
                                        RowFn&& row, uint32_t (&o)[8]) {
  uint32_t mag[4];
  const uint32_t sc = packed::mxfp4_block_mag<MxScaleRule::kRoundUp>(v, amax, mag);
  const int k = static_cast<int>(sc) - 127 - t;
  const int ri = k - kMxFoldMinK;
  const uint64_t r = row(ri < 0 ? 0 : (ri > kMxFoldRows - 1 ? kMxFoldRows - 1 : ri));
  const uint32_t t0 = static_cast<uint32_t>(r), t1 = static_cast<uint32_t>(r >> 32);
  const uint32_t smask = packed::mxfp4_block_signed(amax) ? 0x80808080u : 0u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 4; ++j) {
    fold8_mag(mag[j], t0, t1, sign_bytes4_f32(v + 8 * j), sign_bytes4_f32(v + 8 * j + 4), smask,
              o[2 * j], o[2 * j + 1]);
  }
  if (sc == 0xFFu) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 8; ++i) o[i] = 0x7F7F7F7Fu;
  }
  return sc;
}

#if defined(__CUDACC__)

// The 16-bit element type of the kernels' kF16 flag, for packed_common.cuh's 16-bit vectors.
template <bool kF16>
using Half16Type = std::conditional_t<kF16, __half, __nv_bfloat16>;

// Eight values of one 16-byte vector as floats (element 0 in the low half of r.x).
template <bool kF16>
__device__ __forceinline__ void unpack8(const uint4& r, float* v) {
  packed::unpack8<Half16Type<kF16>>(r, v);
}

// The FP32 bits of the larger |.| of the two 16-bit lanes of a packed::abs_max2 accumulator (NaN
// stays NaN, Inf stays Inf).
template <bool kF16>
__device__ __forceinline__ uint32_t abs_max2_to_f32_bits(uint32_t acc) {
  return packed::Half16<Half16Type<kF16>>::abs16_to_f32_bits(packed::fold_max2(acc));
}

using packed::prmt;  // PTX prmt.b32 (default mode)

// float_to_e4m3 of four finite floats, element i in byte i.
__device__ __forceinline__ uint32_t e4m3x4_finite(float y0, float y1, float y2, float y3) {
  const uint32_t lo = prmt(e4m3_code_hi_finite(y0), e4m3_code_hi_finite(y1), 0x7373u);
  const uint32_t hi = prmt(e4m3_code_hi_finite(y2), e4m3_code_hi_finite(y3), 0x7373u);
  return prmt(lo, hi, 0x5410u);
}

#endif  // __CUDACC__

}  // namespace fp4attn::operand_fast
