// Independent float64 reference for the element codecs, for tests only: code values from the
// format definitions with ldexp, and encoders by brute force (scan every finite code, keep the
// nearest, ties to the even code). Shares nothing with include/fp4attn/numerics/formats.h.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace fp4attn::testing {

struct MiniFormat {
  const char* name;
  int exp_bits;
  int mant_bits;
  int bias;
  bool ieee_specials;  // exponent all-ones is Inf/NaN (E5M2)
  bool fn_nan;         // only the all-ones magnitude is NaN (E4M3fn)
  int sign_bit;        // 3 for E2M1, 7 for the 8-bit formats
};

inline constexpr MiniFormat kE2M1{"e2m1", 2, 1, 1, false, false, 3};
inline constexpr MiniFormat kE4M3{"e4m3", 4, 3, 7, false, true, 7};
inline constexpr MiniFormat kE5M2{"e5m2", 5, 2, 15, true, false, 7};

inline int num_codes(const MiniFormat& f) { return 1 << (f.sign_bit + 1); }
inline int sign_mask(const MiniFormat& f) { return 1 << f.sign_bit; }

// Value of a code from the definition; NaN for NaN codes, +-inf for E5M2 Inf.
inline double ref_value(const MiniFormat& f, int code) {
  const bool negative = (code & sign_mask(f)) != 0;
  const int mag = code & (sign_mask(f) - 1);
  const int e = mag >> f.mant_bits;
  const int m = mag & ((1 << f.mant_bits) - 1);
  const int e_max_field = (1 << f.exp_bits) - 1;
  double v;
  if (f.fn_nan && e == e_max_field && m == (1 << f.mant_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (f.ieee_specials && e == e_max_field) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - f.bias);
  }
  return negative ? -v : v;
}

// The finite non-negative magnitudes, indexed by magnitude code (0 .. largest finite).
inline std::vector<double> finite_magnitudes(const MiniFormat& f) {
  std::vector<double> v;
  for (int c = 0; c < sign_mask(f); ++c) {
    const double x = ref_value(f, c);
    if (!std::isfinite(x)) break;  // the NaN/Inf codes sit at the top
    v.push_back(x);
  }
  return v;
}

// Nearest finite code to the exact value x (ties to the even code), which is RNE plus satfinite.
// NaN and Inf are left to the caller.
inline int ref_encode_finite(const MiniFormat& f, const std::vector<double>& mags, double x) {
  const double a = std::fabs(x);
  const int sign = std::signbit(x) ? sign_mask(f) : 0;
  // Beyond the largest value the nearest is the largest. (Past ~2^52 times the largest value,
  // double distances to every code would round to the same number and fake a tie.)
  if (a >= mags.back()) return sign | static_cast<int>(mags.size() - 1);
  int best = 0;
  double best_d = a;
  for (int c = 1; c < static_cast<int>(mags.size()); ++c) {
    const double d = std::fabs(a - mags[c]);
    if (d < best_d || (d == best_d && (c % 2) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

// The project's full rules for NaN and Inf on top of the finite rule.
inline int ref_encode(const MiniFormat& f, const std::vector<double>& mags, double x) {
  const int sign = std::signbit(x) ? sign_mask(f) : 0;
  if (f.sign_bit == 3) {  // E2M1: NaN -> +0, Inf -> +-6
    if (std::isnan(x)) return 0;
    if (std::isinf(x)) return sign | static_cast<int>(mags.size() - 1);
  } else if (f.fn_nan) {  // E4M3: NaN and Inf -> 0x7F | sign
    if (!std::isfinite(x)) return sign | 0x7F;
  } else {  // E5M2: NaN -> 0x7E | sign, Inf -> 0x7C | sign
    if (std::isnan(x)) return sign | 0x7E;
    if (std::isinf(x)) return sign | 0x7C;
  }
  return ref_encode_finite(f, mags, x);
}

inline uint32_t to_bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// True when two floats are the same value with the same sign, or both NaN.
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || to_bits(a) == to_bits(b);
}

}  // namespace fp4attn::testing
