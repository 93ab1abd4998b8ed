// libFuzzer target: the element codecs of include/fp4attn/numerics/formats.h (E2M1, E4M3fn, E5M2,
// UE8M0). Input: any bytes, read as FP32 bit patterns (4 bytes each) and as codes (1 byte each).
// Invariants, each a trap when broken:
//  * every code decodes and re-encodes to itself, NaN codes to their canonical NaN code;
//  * float -> code is the nearest code (ties to even, satfinite, the documented NaN/Inf rules),
//    checked against the brute-force float64 reference of the GoogleTest suites;
//  * encoding is monotone: x <= y gives decode(encode(x)) <= decode(encode(y));
//  * UE8M0 floor/ceil codes bracket the input within one binade, clamped to [2^-127, 2^127];
//  * E2M1 pairs pack first into the low nibble and unpack back.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fuzz/fuzz_check.h"
#include "support/codec_reference.h"

namespace fp4attn {
namespace {

namespace ref = fp4attn::testing;

struct Codec {
  const ref::MiniFormat& fmt;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  uint8_t canonical_nan;  // the magnitude code a NaN re-encodes to
};

const std::vector<double>& magnitudes(const ref::MiniFormat& f) {
  static const std::vector<double> e2m1 = ref::finite_magnitudes(ref::kE2M1);
  static const std::vector<double> e4m3 = ref::finite_magnitudes(ref::kE4M3);
  static const std::vector<double> e5m2 = ref::finite_magnitudes(ref::kE5M2);
  return &f == &ref::kE2M1 ? e2m1 : (&f == &ref::kE4M3 ? e4m3 : e5m2);
}

// E2M1 takes one nibble; the wrapper keeps every codec behind one signature.
float e2m1_decode(uint8_t c) { return e2m1_to_float(c & 0xF); }

const Codec kCodecs[] = {
    {ref::kE2M1, e2m1_decode, float_to_e2m1, 0x0},  // E2M1 has no NaN: NaN -> +0
    {ref::kE4M3, e4m3_to_float, float_to_e4m3, 0x7F},
    {ref::kE5M2, e5m2_to_float, float_to_e5m2, 0x7E},
};

void check_code(const Codec& c, uint8_t raw) {
  const uint8_t code = raw & static_cast<uint8_t>(ref::num_codes(c.fmt) - 1);
  const float x = c.decode(code);
  // Decoding matches the definition of the format (both NaN, or the same value and sign).
  const double want = ref::ref_value(c.fmt, code);
  FUZZ_CHECK((std::isnan(x) && std::isnan(want)) ||
             (x == want && std::signbit(x) == std::signbit(want)));
  const uint8_t back = c.encode(x);
  if (std::isnan(x)) {
    // E2M1 never decodes to NaN; the FP8 NaNs keep their sign and land on the canonical code.
    FUZZ_CHECK(back == ((code & ref::sign_mask(c.fmt)) | c.canonical_nan));
  } else {
    FUZZ_CHECK(back == code);
  }
}

void check_float(const Codec& c, float x) {
  const uint8_t code = c.encode(x);
  FUZZ_CHECK(code < ref::num_codes(c.fmt));
  FUZZ_CHECK(code == ref::ref_encode(c.fmt, magnitudes(c.fmt), x));
  // The nearest code's value, as a float: no finite input decodes to a NaN, and saturation
  // keeps finite inputs finite (E5M2 encodes only +-Inf as Inf).
  const float y = c.decode(code);
  if (std::isfinite(x)) FUZZ_CHECK(std::isfinite(y));
  if (std::isfinite(x) && std::fabs(x) >= magnitudes(c.fmt).back()) {
    FUZZ_CHECK(std::fabs(y) == magnitudes(c.fmt).back());
  }
}

void check_monotone(const Codec& c, float x, float y) {
  if (std::isnan(x) || std::isnan(y)) return;
  if (x > y) std::swap(x, y);
  const float dx = c.decode(c.encode(x)), dy = c.decode(c.encode(y));
  if (std::isnan(dx) || std::isnan(dy)) return;  // E4M3 has no Inf: +-Inf encodes to NaN
  FUZZ_CHECK(dx <= dy);
}

void check_ue8m0_code(uint8_t code) {
  const float x = ue8m0_to_float(code);
  if (code == 0xFF) {
    FUZZ_CHECK(std::isnan(x));
    return;
  }
  FUZZ_CHECK(x == std::ldexp(1.0, code - 127));
  FUZZ_CHECK(float_to_ue8m0(x, Ue8m0Round::kFloor) == code);
  FUZZ_CHECK(float_to_ue8m0(x, Ue8m0Round::kCeil) == code);
}

void check_ue8m0_float(float x) {
  const uint8_t lo = float_to_ue8m0(x, Ue8m0Round::kFloor);
  const uint8_t hi = float_to_ue8m0(x, Ue8m0Round::kCeil);
  if (x == 0) {
    FUZZ_CHECK(lo == 0 && hi == 0);
    return;
  }
  if (!std::isfinite(x) || x < 0) {
    FUZZ_CHECK(lo == 0xFF && hi == 0xFF);
    return;
  }
  int e;
  std::frexp(static_cast<double>(x), &e);  // x in [2^(e-1), 2^e)
  FUZZ_CHECK(floor_log2(x) == e - 1);
  const int want_lo = std::max(e - 1, -127);
  const bool pow2 = std::ldexp(1.0, e - 1) == x;
  const int want_hi = std::min(std::max(pow2 ? e - 1 : e, -127), 127);
  FUZZ_CHECK(lo == want_lo + 127 && hi == want_hi + 127);
  FUZZ_CHECK(ue8m0_to_float(lo) <= x || want_lo == -127);
  FUZZ_CHECK(ue8m0_to_float(hi) >= x || want_hi == 127);
}

}  // namespace
}  // namespace fp4attn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fp4attn;
  for (size_t i = 0; i < size; ++i) {
    for (const Codec& c : kCodecs) check_code(c, data[i]);
    check_ue8m0_code(data[i]);
    if (i + 1 < size) {
      const uint8_t pair = pack_e2m1x2(data[i], data[i + 1]);
      FUZZ_CHECK(e2m1x2_first(pair) == (data[i] & 0xF) &&
                 e2m1x2_second(pair) == (data[i + 1] & 0xF));
    }
  }
  float prev = 0;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint32_t bits;
    std::memcpy(&bits, data + i, 4);
    const float x = bits_float(bits);
    for (const Codec& c : kCodecs) {
      check_float(c, x);
      check_monotone(c, prev, x);
      // The neighbours of x are where rounding boundaries sit.
      check_monotone(c, x, std::nextafter(x, INFINITY));
    }
    check_ue8m0_float(x);
    prev = x;
  }
  return 0;
}
