// BF16/FP16 bit conversions for host code (round-to-nearest-even, NaN kept NaN).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace fp4attn {

inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);  // quiet NaN, sign kept
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float f16_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

inline uint16_t float_to_f16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7E00;
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to Inf
  if (a < 6.103515625e-05f) {               // subnormal range: quantum 2^-24, RNE via rint
    return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));
  }
  uint32_t ua = std::bit_cast<uint32_t>(a);
  ua += 0xFFF + ((ua >> 13) & 1);  // RNE to 10 mantissa bits
  return sign | uint16_t(((ua >> 23) - 127 + 15) << 10 | ((ua >> 13) & 0x3FF));
}

}  // namespace fp4attn
