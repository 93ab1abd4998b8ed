// The per-thread work of the V operand kernel (operand_v_tile.cuh): a register tile of kTok
// consecutive tokens x kCh adjacent channels (16-bit inputs, two channels per 32-bit word as they
// lie in memory) quantized as the recipe says, from the slice statistics of the pre-pass, to kCh
// rows of V^T bytes. Host and device (FP4ATTN_HD), so that a host harness can run exactly this
// code; the only device-specific pieces are the conversions (hardware cvt on the device, the
// formats.h codecs on the host; equal on every input that reaches them, see e4m3x2_finite).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "cuda/quantize/bf16_rne.h"
#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"

// Full unrolling on the device (the tile's arrays then live in registers); nothing on the host.
#if defined(__CUDA_ARCH__)
#define FP4ATTN_V_UNROLL _Pragma("unroll")
#else
#define FP4ATTN_V_UNROLL
#endif
#if defined(__CUDACC__)
#define FP4ATTN_V_COLD __noinline__
#else
#define FP4ATTN_V_COLD __attribute__((noinline))
#endif

namespace fp4attn::detail::v_operand {

enum class VMode { kBf16, kFp8, kNvfp4, kDirect };

constexpr int kUnitTokens = 32;  // fp4-direct block (tokens)
static_assert(kUnitTokens == kDirectBlock);

// Register tile of one thread: channels x tokens. fp4-direct needs a whole 32-token block per
// thread; the others take 16 tokens (one NVFP4 block, one 16-byte V^T chunk per channel).
template <VMode kMode>
constexpr int kTileCh = kMode == VMode::kDirect ? 2 : 4;
template <VMode kMode>
constexpr int kTileTok = kMode == VMode::kDirect ? 32 : 16;

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

// Value of the low (kHi false) or high 16-bit half of w, for finite inputs (a non-finite one
// may come out as any NaN/Inf: callers only use this where the block is finite).
template <bool kF16, bool kHi>
FP4ATTN_HD float half_value(uint32_t w) {
  if constexpr (!kF16) {
    return bits_float(kHi ? (w & 0xFFFF0000u) : (w << 16));
  } else {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(static_cast<unsigned short>(kHi ? (w >> 16) : w)));
#else
    return to_float<true>(kHi ? (w >> 16) : (w & 0xFFFFu));
#endif
  }
}

// Per-lane unsigned max of two 16-bit lanes.
FP4ATTN_HD uint32_t vmaxu2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

// V^T key order (operands.h operand_v_key_at): positions 0..15 of a 16-key group hold keys
// 0,1,8,9, 2,3,10,11, 4,5,12,13, 6,7,14,15. g[0..3]: the group's natural-order bytes (key 4k+i in
// byte i of g[k]), rewritten in place: four PRMTs, each joining a key pair of g[k] with the pair
// 8 keys later in g[k + 2]. byte_perm, not packed::prmt: the compiler predicates and schedules
// the __byte_perm intrinsic freely, the inline-asm PRMT less (other SASS for fp4-direct).
FP4ATTN_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t ab = (uint64_t{b} << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const int byte = (sel >> (4 * i)) & 7;
    r |= static_cast<uint32_t>((ab >> (8 * byte)) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}
FP4ATTN_HD void permute_keys16_bytes(uint32_t* g) {
  const uint32_t w0 = g[0], w1 = g[1], w2 = g[2], w3 = g[3];
  g[0] = byte_perm(w0, w2, 0x5410);  // keys 0, 1, 8, 9
  g[1] = byte_perm(w0, w2, 0x7632);  // keys 2, 3, 10, 11
  g[2] = byte_perm(w1, w3, 0x5410);  // keys 4, 5, 12, 13
  g[3] = byte_perm(w1, w3, 0x7632);  // keys 6, 7, 14, 15
}
// The same for 16-bit codes: g[0..7] hold keys 2k, 2k + 1 in g[k]; whole words move (register
// renaming only).
FP4ATTN_HD void permute_keys16_halves(uint32_t* g) {
  uint32_t w[8];
  FP4ATTN_V_UNROLL
  for (int k = 0; k < 8; ++k) w[k] = g[k];
  FP4ATTN_V_UNROLL
  for (int k = 0; k < 4; ++k) {
    g[2 * k] = w[k];          // keys 2k, 2k + 1
    g[2 * k + 1] = w[k + 4];  // keys 2k + 8, 2k + 9
  }
}

// E4M3 codes of two finite floats (lo in bits 0..7, hi in bits 8..15): RNE incl. subnormals,
// finite overflow saturates to +-448, -0 -> 0x80: float_to_e4m3 on finite inputs. The device
// uses cvt.rn.satfinite.e4m3x2.f32, which is float_to_e4m3 for every finite float (sweep:
// the lead's device check over all 2^32 floats).
FP4ATTN_HD uint32_t e4m3x2_finite(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(float_to_e4m3(lo)) | (static_cast<uint32_t>(float_to_e4m3(hi)) << 8);
#endif
}

// Value of an E4M3 code other than the NaN codes, exact (hardware cvt through FP16 on the device,
// where every E4M3 value is an FP16 value).
FP4ATTN_HD float e4m3_value(uint32_t code) {
#if defined(__CUDA_ARCH__)
  // The code in both bytes: both FP16 halves hold its value (no reliance on the lane order).
  unsigned int h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;"
      : "=r"(h2)
      : "h"(static_cast<unsigned short>((code & 0xFFu) * 0x101u)));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu)));
#else
  return e4m3_to_float(static_cast<uint8_t>(code));
#endif
}

// Folded FP4 value sign(y) * RN_E2M1(|y|) * f, for y that is not NaN (Inf saturates to 6), as
// e2m1_code_fast (packed_common.cuh) does the rounding: a = min(|y|, 6), p = the binade of
// max(a, 1), m = p * 2^22 + a rounds a onto the E2M1 grid (RNE, ties to the even code); then
// (m - p * 2^22) * f = fma(m, f, -p * (2^22 f)) is exact whenever r * f is (r has two
// significant bits; f a power of two or an E4M3 value / 8, and 2^22 f is exact). k22 = 2^22 f.
FP4ATTN_HD float fold_e2m1(float y, float f, float k22) {
  const float a = fminf(fabsf(y), kE2m1Max);
  const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
  const float m = fmaf(p, 4194304.f, a);
  const float v = fmaf(m, f, -mul_rn(p, k22));
  return bits_float(float_bits(v) | (float_bits(y) & 0x80000000u));
}

// E4M3(e2m1(x * inv) * f8) with the generic codecs (the rare overflowing-inv case).
FP4ATTN_V_COLD FP4ATTN_HD uint32_t nvfp4_fold_generic(float x, float inv, float f8) {
  const uint8_t code = float_to_e2m1(mul_rn(x, inv));
  return float_to_e4m3(mul_rn(e2m1_to_float(code), f8));
}

// Slice statistics from the pre-pass (FP32 bits; unused by recipes that need none).
struct VUnitStats {
  uint32_t slice_amax = 0;  // NaN-propagating max |x| of the (b, h) slice
  uint32_t slice_fin = 0;   // largest finite 32-token block amax of the slice + 1 (0: none)
  float tensor_scale = 0;   // static s_enc, or 0
};

// The channel scale (scale[b, h, c]) of a recipe; chan_amax: FP32 bits of the channel amax.
template <VMode kMode>
FP4ATTN_HD float channel_scale(uint32_t chan_amax, const VUnitStats& st) {
  if constexpr (kMode == VMode::kBf16) {
    return 1.f;
  } else if constexpr (kMode == VMode::kFp8) {
    const float amax = bits_float(chan_amax);
    if (!is_finite(amax)) return bits_float(kQuietNan);
    if (amax == 0.f) return 1.f;
    return div_rn(amax, kE4m3Max);
  } else if constexpr (kMode == VMode::kNvfp4) {
    const float s_enc = st.tensor_scale != 0.f ? st.tensor_scale
                                               : nvfp4_tensor_scale(bits_float(st.slice_amax),
                                                                    Nvfp4ScaleRule::kNearest);
    return div_rn(8.f, s_enc);
  } else {
    int t = 0;
    if (st.slice_fin != 0) {
      const float top = bits_float(st.slice_fin - 1);
      uint8_t unused;
      t = direct_v_quantize_block(&top, 1, 1, &unused) - kOperandPow2FoldTop;
    }
    return div_rn(t >= -126 ? pow2_normal(t) : scale_pow2(1.f, t), 6.f);
  }
}

// fp8-style: the multiplier 448 / amax of a channel with a finite nonzero amax (FP32 bits),
// FLT_MAX where the quotient overflows. fp8_inv_code: the same for any amax, 0 for amax 0 and
// NaN for a non-finite amax (what quantize_v_tile<..., true> takes instead of the amax).
FP4ATTN_HD float fp8_inverse(uint32_t chan_amax) {
  const float inv = div_rn(kE4m3Max, bits_float(chan_amax));
  return is_finite(inv) ? inv : bits_float(kFltMaxBits);
}
FP4ATTN_HD float fp8_inv_code(uint32_t chan_amax) {
  const float amax = bits_float(chan_amax);
  if (amax == 0.f) return 0.f;
  if (!is_finite(amax)) return bits_float(kQuietNan);
  return fp8_inverse(chan_amax);
}

// Writes, for channel j of the tile (kHi: the high half of the words raw[i]), the kTok output
// bytes of the row (4 per word, little endian) from values v_i = half(raw[i * kWordStride]).
// amax16: |x| bits of the whole channel block(s) as needed by the mode (see quantize_v_tile).
// kPreInv (fp8 only): chan_amax holds the FP32 bits of fp8_inv_code(amax) instead of the amax.
template <VMode kMode, bool kF16, bool kHi, int kTok, int kWordStride, bool kPreInv = false>
FP4ATTN_HD void quantize_v_channel(const uint32_t* raw, uint32_t chan_amax, float s_enc, int t,
                                   const uint32_t* amax16, uint32_t* words) {
  if constexpr (kMode == VMode::kFp8) {
    float inv;
    if constexpr (kPreInv) {
      inv = bits_float(chan_amax);
      if (!(inv > 0.f)) {  // amax 0 (inv 0) or non-finite (inv NaN)
        const uint32_t fill = inv == 0.f ? 0u : 0x7F7F7F7Fu;
        FP4ATTN_V_UNROLL
        for (int k = 0; k < kTok / 4; ++k) words[k] = fill;
        return;
      }
    } else {
      const float amax = bits_float(chan_amax);
      if (!is_finite(amax) || amax == 0.f) {
        const uint32_t fill = amax == 0.f ? 0u : 0x7F7F7F7Fu;
        FP4ATTN_V_UNROLL
        for (int k = 0; k < kTok / 4; ++k) words[k] = fill;
        return;
      }
      inv = fp8_inverse(chan_amax);
    }
    // Every x of the channel is finite, |x| <= amax: x * inv is finite (<= 448 (1 + 2^-23)).
    FP4ATTN_V_UNROLL
    for (int k = 0; k < kTok / 4; ++k) {
      float y[4];
      FP4ATTN_V_UNROLL
      for (int i = 0; i < 4; ++i) {
        y[i] = mul_rn(half_value<kF16, kHi>(raw[(4 * k + i) * kWordStride]), inv);
      }
      words[k] = e4m3x2_finite(y[0], y[1]) | (e4m3x2_finite(y[2], y[3]) << 16);
    }
  } else if constexpr (kMode == VMode::kNvfp4) {
    // nvfp4_quantize_block (nearest) per 16 tokens, then E4M3(e2m1 * scale / 8).
    FP4ATTN_V_UNROLL
    for (int b = 0; b < kTok / kNvfp4Block; ++b) {
      uint32_t* out = words + b * (kNvfp4Block / 4);
      const uint32_t a16 = amax16[b];
      // NaN/Inf block or NaN s_enc: scale NaN, codes 0: every folded value NaN (0 * NaN).
      uint32_t fill = 0x7F7F7F7Fu;
      bool uniform = true;
      float sf = 0.f, f = 0.f, inv = 0.f;
      if (a16 < kNonFinite16<kF16>) {
        const float amax = to_float<kF16>(a16);
        sf = mul_rn(div_rn(amax, kE2m1Max), s_enc);
        if (!abs_bits_is_nan(float_bits(sf) & kAbsMask)) {
          const float flt_max = bits_float(kFltMaxBits);
          sf = sf > flt_max ? flt_max : sf;
          // sf finite: the code is not 0x7F/0xFF.
          f = e4m3_value(e4m3x2_finite(sf, 0.f) & 0xFFu);
          if (f == 0.f) {
            fill = 0u;  // all codes +0
          } else {
            inv = div_rn(s_enc, f);
            uniform = false;
          }
        }
      }
      if (uniform) {
        FP4ATTN_V_UNROLL
        for (int k = 0; k < kNvfp4Block / 4; ++k) out[k] = fill;
        continue;
      }
      const float f8 = mul_rn(f, 0.125f);  // exact (f >= 2^-9)
      if (is_finite(inv)) {
        const float k22 = mul_rn(f8, 4194304.f);
        FP4ATTN_V_UNROLL
        for (int k = 0; k < kNvfp4Block / 4; ++k) {
          float y[4];
          FP4ATTN_V_UNROLL
          for (int i = 0; i < 4; ++i) {
            const float x = half_value<kF16, kHi>(raw[(b * kNvfp4Block + 4 * k + i) * kWordStride]);
            y[i] = fold_e2m1(mul_rn(x, inv), f8, k22);
          }
          out[k] = e4m3x2_finite(y[0], y[1]) | (e4m3x2_finite(y[2], y[3]) << 16);
        }
      } else {
        // inv overflowed (huge s_enc, tiny block scale): x * inv is +-Inf, or NaN for x = +-0,
        // which float_to_e2m1 takes to code +0. The generic codecs, rarely (out of line: cold).
        FP4ATTN_V_UNROLL
        for (int k = 0; k < kNvfp4Block / 4; ++k) {
          uint32_t w = 0;
          FP4ATTN_V_UNROLL
          for (int i = 0; i < 4; ++i) {
            const float x = half_value<kF16, kHi>(raw[(b * kNvfp4Block + 4 * k + i) * kWordStride]);
            w |= nvfp4_fold_generic(x, inv, f8) << (8 * i);
          }
          out[k] = w;
        }
      }
    }
  } else {  // kDirect: one 32-token block (kTok == 32)
    static_assert(kMode != VMode::kDirect || kTok == kDirectBlock);
    const uint32_t a16 = amax16[0];
    if (a16 >= kNonFinite16<kF16> || a16 == 0) {
      // NaN/Inf block: NaN codes; all-zero block: codes +0 (e = -127), values +0.
      const uint32_t fill = a16 == 0 ? 0u : 0x7F7F7F7Fu;
      FP4ATTN_V_UNROLL
      for (int k = 0; k < kTok / 4; ++k) words[k] = fill;
      return;
    }
    // direct_v_quantize_block: e = nearest power of two of the block amax (switch at 1.5 * 2^k,
    // i.e. at a normalized fraction >= 0.5).
    const float amax = to_float<kF16>(a16);
    int e = floor_log2(amax);
    if (normalized_fraction(float_bits(amax)) >= 0x400000u) ++e;
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    // codes = e2m1(RN(x * 2^-e) * 6). x * 2^-e is exact unless it is below 2^-126, where both
    // forms below give code +-0: so RN(x * (3 * 2^(1 - e))) for e >= -125 (finite, exact),
    // and (x * 2^-e) * 6 for e = -127, -126. value = e2m1 * 2^(e - t), E4M3-rounded; a factor
    // 2^(e - t) below 2^-126 folds to +-0 in E4M3 just as 2^-126 does (6 * 2^-126 < 2^-10).
    const float fa = e >= -125 ? mul_rn(3.f, pow2_normal(1 - e)) : pow2_normal(-e);
    const float fb = e >= -125 ? 1.f : 6.f;
    const int k_fold = e - t < -126 ? -126 : e - t;  // e - t <= 6
    const float pf = pow2_normal(k_fold);
    const float k22 = mul_rn(pf, 4194304.f);
    FP4ATTN_V_UNROLL
    for (int k = 0; k < kTok / 4; ++k) {
      float y[4];
      FP4ATTN_V_UNROLL
      for (int i = 0; i < 4; ++i) {
        const float x = half_value<kF16, kHi>(raw[(4 * k + i) * kWordStride]);
        y[i] = fold_e2m1(mul_rn(mul_rn(x, fa), fb), pf, k22);
      }
      words[k] = e4m3x2_finite(y[0], y[1]) | (e4m3x2_finite(y[2], y[3]) << 16);
    }
  }
}

// The thread tile: raw[i * (kCh / 2) + w] is word w (channels 2w, 2w + 1) of token i (0 for
// tokens past s). live: tokens of the tile that are real (<= 0: none); the rest are written as
// 0. chan_amax[j]: FP32 bits of channel j's amax (fp8-style). words[j * kWords + k]: output word
// k of channel j's V^T row (kWords = kTok / 4, or kTok / 2 for bf16). kPreInv (fp8): chan_amax[j]
// holds the FP32 bits of fp8_inv_code(amax) (computed once per channel, out of the tile's way).
template <VMode kMode, bool kF16, int kCh, int kTok, bool kPreInv = false>
FP4ATTN_HD void quantize_v_tile(const uint32_t* raw, int live, const uint32_t* chan_amax,
                                const VUnitStats& st, uint32_t* words) {
  constexpr int kW = kCh / 2;  // words per token
  constexpr int kWords = kMode == VMode::kBf16 ? kTok / 2 : kTok / 4;
  if constexpr (kMode == VMode::kBf16) {
    FP4ATTN_V_UNROLL
    for (int w = 0; w < kW; ++w) {
      FP4ATTN_V_UNROLL
      for (int k = 0; k < kTok / 2; ++k) {
        const uint32_t r0 = raw[(2 * k) * kW + w], r1 = raw[(2 * k + 1) * kW + w];
        uint32_t lo[2], hi[2];
        FP4ATTN_V_UNROLL
        for (int q = 0; q < 2; ++q) {
          const uint32_t r = q == 0 ? r0 : r1;
          if constexpr (kF16) {
            lo[q] = bf16_rne_bits(to_float<true>(r & 0xFFFFu));
            hi[q] = bf16_rne_bits(to_float<true>(r >> 16));
          } else {
            // BF16 -> BF16: NaN quieted ((bits >> 16) | 0x40 of the FP32 value).
            const uint32_t a = r & 0xFFFFu, b = r >> 16;
            lo[q] = (a & 0x7FFFu) > 0x7F80u ? (a | 0x40u) : a;
            hi[q] = (b & 0x7FFFu) > 0x7F80u ? (b | 0x40u) : b;
          }
        }
        words[(2 * w) * kWords + k] = lo[0] | (lo[1] << 16);
        words[(2 * w + 1) * kWords + k] = hi[0] | (hi[1] << 16);
      }
    }
  } else {
    float s_enc = 0.f;
    if constexpr (kMode == VMode::kNvfp4) {
      s_enc = st.tensor_scale != 0.f
                  ? st.tensor_scale
                  : nvfp4_tensor_scale(bits_float(st.slice_amax), Nvfp4ScaleRule::kNearest);
    }
    int t = 0;
    if constexpr (kMode == VMode::kDirect) {
      if (st.slice_fin != 0) {
        const float top = bits_float(st.slice_fin - 1);
        uint8_t unused;
        t = direct_v_quantize_block(&top, 1, 1, &unused) - kOperandPow2FoldTop;
      }
    }
    // Block amax on the 16-bit |x| bits, two channels per word (NaN-propagating).
    constexpr int kBlk = kMode == VMode::kNvfp4 ? kNvfp4Block : kTok;
    constexpr int kNb = kTok / kBlk;
    uint32_t am[kW][kNb > 0 ? kNb : 1] = {};
    if constexpr (kMode != VMode::kFp8) {
      FP4ATTN_V_UNROLL
      for (int w = 0; w < kW; ++w) {
        FP4ATTN_V_UNROLL
        for (int b = 0; b < kNb; ++b) {
          uint32_t m = 0;
          FP4ATTN_V_UNROLL
          for (int i = 0; i < kBlk; ++i) m = vmaxu2(m, raw[(b * kBlk + i) * kW + w] & 0x7FFF7FFFu);
          am[w][b] = m;
        }
      }
    }
    FP4ATTN_V_UNROLL
    for (int w = 0; w < kW; ++w) {
      uint32_t a_lo[kNb > 0 ? kNb : 1], a_hi[kNb > 0 ? kNb : 1];
      FP4ATTN_V_UNROLL
      for (int b = 0; b < kNb; ++b) {
        a_lo[b] = am[w][b] & 0xFFFFu;
        a_hi[b] = am[w][b] >> 16;
      }
      quantize_v_channel<kMode, kF16, false, kTok, kW, kPreInv>(raw + w, chan_amax[2 * w], s_enc, t,
                                                                a_lo, words + (2 * w) * kWords);
      quantize_v_channel<kMode, kF16, true, kTok, kW, kPreInv>(
          raw + w, chan_amax[2 * w + 1], s_enc, t, a_hi, words + (2 * w + 1) * kWords);
    }
  }
  // Tokens past s: 0.
  if (live < kTok) {
    constexpr int kPerWord = kMode == VMode::kBf16 ? 2 : 4;
    constexpr int kBits = 32 / kPerWord;
    FP4ATTN_V_UNROLL
    for (int j = 0; j < kCh; ++j) {
      FP4ATTN_V_UNROLL
      for (int k = 0; k < kWords; ++k) {
        const int n = live - k * kPerWord;  // real tokens in this word
        const uint32_t keep =
            n >= kPerWord ? 0xFFFFFFFFu : (n <= 0 ? 0u : (1u << (kBits * n)) - 1u);
        words[j * kWords + k] &= keep;
      }
    }
  }
}

}  // namespace fp4attn::detail::v_operand
