// The per-thread work of the V operand kernel (operand_v.cu): 32 consecutive tokens of one channel
// quantized as the recipe says, from the 16-bit inputs and the slice statistics of the pre-pass.
// Host and device (FP4ATTN_HD), so that a host harness can run exactly this code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "fp4attn/config.h"
#include "fp4attn/direct_p.h"
#include "fp4attn/formats.h"
#include "fp4attn/quantize.h"

// Full unrolling on the device (the unit's arrays then live in registers); nothing on the host.
#if defined(__CUDA_ARCH__)
#define FP4ATTN_V_UNROLL _Pragma("unroll")
#else
#define FP4ATTN_V_UNROLL
#endif

namespace fp4attn::detail::v_operand {

enum class VMode { kBf16, kFp8, kNvfp4, kDirect };

constexpr int kUnitTokens = 32;  // tokens per thread: one fp4-direct block, two NVFP4 blocks
constexpr int kPow2FoldTop = 6;  // golden_operands.cc: the largest block lands at 2^6
static_assert(kUnitTokens == kDirectBlock && kUnitTokens % kNvfp4Block == 0);

// |x| bits of a 16-bit input at or above this are Inf or NaN (|x| bits order like |x|, NaN last).
template <bool kF16>
constexpr uint32_t kNonFinite16 = kF16 ? 0x7C00u : 0x7F80u;

// Exact FP32 value of a 16-bit input (low 16 bits of h). FP16 NaNs become sign | quiet NaN |
// payload << 13, the value the host reference sees (f16_bits_to_float, quieted by its trip
// through double).
template <bool kF16>
FP4ATTN_HD float to_float(uint32_t h) {
  if constexpr (kF16) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m != 0 ? 0x400000u : 0u) | (m << 13));
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
    if (e == 0) return with_sign(mul_rn(static_cast<float>(m), 5.9604644775390625e-8f), sign != 0);
    return bits_float(sign | ((e - 15 + 127) << 23) | (m << 13));
#endif
  } else {
    return bits_float(h << 16);
  }
}

// BF16 bits of x, RNE, NaN -> (bits >> 16) | 0x40: float_to_bf16_bits of common/half.h.
FP4ATTN_HD uint32_t bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return u >> 16;
}

// Slice statistics from the pre-pass (FP32 bits; unused by recipes that need none).
struct VUnitStats {
  uint32_t chan_amax = 0;   // NaN-propagating max |x| of the channel
  uint32_t slice_amax = 0;  // NaN-propagating max |x| of the (b, h) slice
  uint32_t slice_fin = 0;   // largest finite 32-token block amax of the slice + 1 (0: none)
  float tensor_scale = 0;   // static s_enc, or 0
};

// Quantizes values col[i * kStride] (i < 32, 16-bit codes; tokens past s read as 0) of one
// channel; tokens i >= live are written as 0. words: the V^T bytes of the 32 tokens, little
// endian (16 words of two BF16 codes for kBf16, 8 words of four E4M3 codes otherwise). Returns
// the channel scale.
template <VMode kMode, bool kF16, int kStride>
FP4ATTN_HD float quantize_v_unit(const uint16_t* col, int live, const VUnitStats& st,
                                 uint32_t* words) {
  if constexpr (kMode == VMode::kBf16) {
    FP4ATTN_V_UNROLL
    for (int k = 0; k < kUnitTokens / 2; ++k) {
      const uint32_t lo = 2 * k < live ? bf16_bits(to_float<kF16>(col[2 * k * kStride])) : 0u;
      const uint32_t hi =
          2 * k + 1 < live ? bf16_bits(to_float<kF16>(col[(2 * k + 1) * kStride])) : 0u;
      words[k] = lo | (hi << 16);
    }
    return 1.f;
  } else {
    uint8_t out[kUnitTokens];
    float scale;
    if constexpr (kMode == VMode::kFp8) {
      // fp8_quantize_block (quantize.h) with the channel's amax from the pre-pass.
      const float amax = bits_float(st.chan_amax);
      const bool bad = !is_finite(amax), zero = amax == 0.f;
      float inv = 0.f;
      if (bad) {
        scale = bits_float(kQuietNan);
      } else if (zero) {
        scale = 1.f;
      } else {
        scale = div_rn(amax, kE4m3Max);
        inv = div_rn(kE4m3Max, amax);
        if (!is_finite(inv)) inv = bits_float(kFltMaxBits);
      }
      FP4ATTN_V_UNROLL
      for (int i = 0; i < kUnitTokens; ++i) {
        out[i] =
            bad ? 0x7F : (zero ? 0 : float_to_e4m3(mul_rn(to_float<kF16>(col[i * kStride]), inv)));
      }
    } else if constexpr (kMode == VMode::kNvfp4) {
      const float s_enc = st.tensor_scale != 0.f ? st.tensor_scale
                                                 : nvfp4_tensor_scale(bits_float(st.slice_amax),
                                                                      Nvfp4ScaleRule::kNearest);
      FP4ATTN_V_UNROLL
      for (int b16 = 0; b16 < kUnitTokens / kNvfp4Block; ++b16) {
        float v[kNvfp4Block];
        FP4ATTN_V_UNROLL
        for (int i = 0; i < kNvfp4Block; ++i) {
          v[i] = to_float<kF16>(col[(b16 * kNvfp4Block + i) * kStride]);
        }
        uint8_t codes[kNvfp4Block];
        const uint8_t sc =
            nvfp4_quantize_block(v, kNvfp4Block, s_enc, Nvfp4ScaleRule::kNearest, codes);
        const float f = e4m3_to_float(sc);
        FP4ATTN_V_UNROLL
        for (int i = 0; i < kNvfp4Block; ++i) {
          // e2m1 * scale is exact in FP32, and so is / 8: one rounding, as the host's double.
          out[b16 * kNvfp4Block + i] =
              float_to_e4m3(mul_rn(mul_rn(e2m1_to_float(codes[i]), f), 0.125f));
        }
      }
      scale = div_rn(8.f, s_enc);
    } else {  // kDirect
      float v[kDirectBlock];
      FP4ATTN_V_UNROLL
      for (int i = 0; i < kDirectBlock; ++i) v[i] = to_float<kF16>(col[i * kStride]);
      uint8_t codes[kDirectBlock];
      const int e = direct_v_quantize_block(v, kDirectBlock, 1, codes);
      // The slice's largest finite block exponent is the exponent of its largest finite block
      // amax (direct_v_quantize_block's exponent is non-decreasing in the amax).
      int t = 0;
      if (st.slice_fin != 0) {
        const float top = bits_float(st.slice_fin - 1);
        uint8_t unused;
        t = direct_v_quantize_block(&top, 1, 1, &unused) - kPow2FoldTop;
      }
      FP4ATTN_V_UNROLL
      for (int i = 0; i < kDirectBlock; ++i) {
        out[i] =
            e == kDirectNanExp ? 0x7F : float_to_e4m3(scale_pow2(e2m1_to_float(codes[i]), e - t));
      }
      scale = div_rn(t >= -126 ? pow2_normal(t) : scale_pow2(1.f, t), 6.f);
    }
    FP4ATTN_V_UNROLL
    for (int k = 0; k < kUnitTokens / 4; ++k) {
      uint32_t word = 0;
      FP4ATTN_V_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint32_t b = 4 * k + i < live ? out[4 * k + i] : 0u;
        word |= b << (8 * i);
      }
      words[k] = word;
    }
    return scale;
  }
}

}  // namespace fp4attn::detail::v_operand
