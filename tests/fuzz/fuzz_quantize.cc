// libFuzzer target: the block quantizers of include/fp4attn/numerics/quantize.h (NVFP4 with each
// scale rule, MXFP4 with each rule, FP8 with an FP32 scale) and the row helpers of
// src/formats/quantize_rows.cc. Input: [format+rule][n][mode][s_enc: 4][exponent] then values
// (raw FP32 bits, or int16 * 2^exponent for realistic blocks). Invariants, a trap when broken:
//  * a NaN/Inf anywhere in the block gives the NaN scale and the documented codes;
//  * scale codes are valid and follow the rule's definition (nearest, the smallest E4M3 / allowed
//    value >= sf, one of the two four-over-six candidates; the MX exponents);
//  * decoded values are within half an E2M1 (E4M3, E5M2) step of the input, saturation aside
//    where the rule allows it; MXFP4 codes are the nearest E2M1 of the exactly scaled input;
//  * negating the block negates the codes and keeps the scale; a tail block equals the block
//    padded with zeros; the row helpers equal the block calls; pack/unpack round-trips.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fuzz/fuzz_check.h"
#include "support/codec_reference.h"

namespace fp4attn {
namespace {

namespace ref = fp4attn::testing;

constexpr Nvfp4ScaleRule kNvRules[] = {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp,
                                       Nvfp4ScaleRule::kFourOverSix, Nvfp4ScaleRule::kRestricted};

// Reads the fuzz input front to back; missing bytes read as zero.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(byte()) << (8 * i);
    return v;
  }
};

bool finite(float x) { return std::isfinite(x); }

float negate(float x) { return bits_float(float_bits(x) ^ 0x80000000u); }

// Half the gap between the E2M1 values around |y| (|y| <= 6).
double e2m1_half_step(double y) {
  y = std::fabs(y);
  return y <= 2 ? 0.25 : (y <= 4 ? 0.5 : 1.0);
}

bool any_non_finite(const float* x, int n) {
  for (int i = 0; i < n; ++i) {
    if (!finite(x[i])) return true;
  }
  return false;
}

// The restricted rule's scales, {1, 1.25, 1.5} * 2^e for e in [-3, 8], capped at 384.
bool restricted_value(double f) {
  for (int e = -3; e <= 8; ++e) {
    for (double m : {1.0, 1.25, 1.5}) {
      if (f == std::ldexp(m, e) && f <= kRestrictedScaleMax) return true;
    }
  }
  return false;
}

// computed: s_enc is nvfp4_tensor_scale of the data (what the library does), not a static one.
void check_nvfp4(const float* x, int n, float s_enc, Nvfp4ScaleRule rule, bool computed) {
  uint8_t codes[kNvfp4Block];
  const uint8_t scale = nvfp4_quantize_block(x, n, s_enc, rule, codes);
  for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] <= 0xF);

  // A tail block is quantized as if padded with zeros.
  float padded[kNvfp4Block] = {};
  std::memcpy(padded, x, sizeof(float) * n);
  uint8_t full[kNvfp4Block];
  FUZZ_CHECK(nvfp4_quantize_block(padded, kNvfp4Block, s_enc, rule, full) == scale);
  for (int i = 0; i < n; ++i) FUZZ_CHECK(full[i] == codes[i]);

  // Negation: the same scale, every code's sign flipped (a zero code may carry either sign).
  float neg[kNvfp4Block];
  for (int i = 0; i < n; ++i) neg[i] = negate(x[i]);
  uint8_t neg_codes[kNvfp4Block];
  FUZZ_CHECK(nvfp4_quantize_block(neg, n, s_enc, rule, neg_codes) == scale);
  for (int i = 0; i < n; ++i) {
    FUZZ_CHECK((neg_codes[i] & 7) == (codes[i] & 7));
    if (codes[i] & 7) FUZZ_CHECK((neg_codes[i] ^ codes[i]) == 0x8);
  }

  const bool nan_block = any_non_finite(x, n) || std::isnan(s_enc);
  if (nan_block) {
    FUZZ_CHECK(scale == 0x7F);
    for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == 0);
    return;
  }
  // The rules below are stated for the documented s_enc: finite and > 0.
  if (!(s_enc > 0) || !finite(s_enc)) return;
  FUZZ_CHECK(scale <= 0x7E);  // not NaN, not negative
  const float amax = block_amax(x, n);
  const float flt_max = 3.4028234663852886e38f;
  const float sf = std::fmin(amax / 6.f * s_enc, flt_max);  // the documented FP32 ops
  const double f = e4m3_to_float(scale);
  switch (rule) {
    case Nvfp4ScaleRule::kNearest:
      FUZZ_CHECK(scale == float_to_e4m3(sf));
      break;
    case Nvfp4ScaleRule::kRoundUp:
      FUZZ_CHECK(f >= sf || scale == 0x7E);
      FUZZ_CHECK(scale == 0 || e4m3_to_float(scale - 1) < sf);
      break;
    case Nvfp4ScaleRule::kRestricted:
      FUZZ_CHECK(f == 0 ? sf == 0 : restricted_value(f));
      FUZZ_CHECK(f >= sf || f == kRestrictedScaleMax);
      // The smallest allowed value >= sf.
      for (int e = -3; e <= 8; ++e) {
        for (double m : {1.0, 1.25, 1.5}) {
          const double g = std::ldexp(m, e);
          if (g <= kRestrictedScaleMax && g >= sf && sf > 0) FUZZ_CHECK(f <= g);
        }
      }
      break;
    case Nvfp4ScaleRule::kFourOverSix: {
      const float sf4 = std::fmin(amax / 4.f * s_enc, flt_max);
      FUZZ_CHECK(scale == float_to_e4m3(sf) || scale == float_to_e4m3(sf4));
      break;
    }
  }
  if (f == 0) {
    for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == 0);
    const bool rounds_up = rule == Nvfp4ScaleRule::kRoundUp || rule == Nvfp4ScaleRule::kRestricted;
    FUZZ_CHECK(rounds_up ? sf == 0 : sf <= 0x1p-10);
    return;
  }
  // inv = s_enc / f is the documented FP32 factor; where it overflows (s_enc near FLT_MAX on a
  // subnormal scale) every nonzero element saturates, outside what the bound covers. Static
  // scales below numerics.md section 9's range (6 * 384 / FLT_MAX) overflow the decode.
  if (!finite(s_enc / static_cast<float>(f)) || s_enc < 6.f * 384.f / flt_max) return;
  const double unit = f / s_enc;  // one E2M1 unit in x's units
  for (int i = 0; i < n; ++i) {
    const double xi = x[i];
    const double deq = nvfp4_dequantize(codes[i], scale, s_enc);
    // A static scale far from the data's may decode past FLT_MAX (numerics.md section 9: "still
    // quantizes badly"); the computed one never does.
    if (!computed && std::isinf(deq)) continue;
    FUZZ_CHECK(std::isfinite(deq));
    FUZZ_CHECK(deq == 0 || std::signbit(deq) == std::signbit(xi));
    // FP32 rounding of inv, x * inv and the decode division, plus the subnormal quantum.
    const double slack = 0x1p-20 * (std::fabs(xi) + std::fabs(deq)) + 0x1p-148;
    const double y = xi / unit;
    if (std::fabs(y) <= 6) {
      FUZZ_CHECK(std::fabs(xi - deq) <= e2m1_half_step(y) * unit + slack);
      continue;
    }
    FUZZ_CHECK((codes[i] & 7) == 7);  // saturation: +-6
    const bool capped =
        scale == 0x7E || (rule == Nvfp4ScaleRule::kRestricted && f == kRestrictedScaleMax);
    if (capped) continue;
    if (rule == Nvfp4ScaleRule::kRoundUp || rule == Nvfp4ScaleRule::kRestricted) {
      FUZZ_CHECK(std::fabs(y) <= 6 * (1 + 0x1p-20));
    } else if (f >= 0x1p-6) {  // a normal E4M3 scale is within 1/16 of sf
      FUZZ_CHECK(std::fabs(y) <= 6 * 17.0 / 16 * (1 + 0x1p-20));
    }
  }
}

void check_mxfp4(const float* x, int n, MxScaleRule rule) {
  uint8_t codes[kMxfp4Block];
  const uint8_t scale = mxfp4_quantize_block(x, n, rule, codes);
  float padded[kMxfp4Block] = {};
  std::memcpy(padded, x, sizeof(float) * n);
  uint8_t full[kMxfp4Block];
  FUZZ_CHECK(mxfp4_quantize_block(padded, kMxfp4Block, rule, full) == scale);
  for (int i = 0; i < n; ++i) FUZZ_CHECK(full[i] == codes[i] && codes[i] <= 0xF);
  float neg[kMxfp4Block];
  for (int i = 0; i < n; ++i) neg[i] = negate(x[i]);
  uint8_t neg_codes[kMxfp4Block];
  FUZZ_CHECK(mxfp4_quantize_block(neg, n, rule, neg_codes) == scale);
  for (int i = 0; i < n; ++i) {
    FUZZ_CHECK((neg_codes[i] & 7) == (codes[i] & 7));
    if (codes[i] & 7) FUZZ_CHECK((neg_codes[i] ^ codes[i]) == 0x8);
  }

  const float amax = block_amax(x, n);
  if (!finite(amax) || amax == 0) {
    FUZZ_CHECK(scale == (finite(amax) ? 0x00 : 0xFF));
    for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == 0);
    return;
  }
  FUZZ_CHECK(scale != 0xFF);
  const int e = scale - 127;
  int fe;
  std::frexp(static_cast<double>(amax), &fe);  // amax in [2^(fe-1), 2^fe)
  const int floor_e = std::min(std::max(fe - 1 - 2, -127), 127);
  if (rule == MxScaleRule::kOcpFloor) {
    FUZZ_CHECK(e == floor_e);
  } else {
    // The smallest e with amax <= 6 * 2^e (clamped): never saturates.
    FUZZ_CHECK(amax <= std::ldexp(6.0, e));
    FUZZ_CHECK(e == -127 || amax > std::ldexp(6.0, e - 1));
  }
  static const std::vector<double> mags = ref::finite_magnitudes(ref::kE2M1);
  for (int i = 0; i < n; ++i) {
    const double scaled = std::ldexp(static_cast<double>(x[i]), -e);  // exact in double
    const int want = ref::ref_encode(ref::kE2M1, mags, scaled);
    // A float subnormal scaled value rounds before encoding; both give a zero magnitude.
    FUZZ_CHECK(codes[i] == want || ((codes[i] & 7) == 0 && (want & 7) == 0));
    const double deq = mxfp4_dequantize(codes[i], scale);
    // Known: round-up picks e = 126 for amax above 1.5 * 2^127, where codes 4 and 6 decode to
    // 2^128 and more, past FLT_MAX: the FP32 decode is +-inf (reported with issue 26's fuzzing).
    if (rule == MxScaleRule::kRoundUp && e == 126 && std::isinf(deq)) continue;
    FUZZ_CHECK(std::isfinite(deq));
    if (std::fabs(scaled) <= 6) {
      FUZZ_CHECK(std::fabs(x[i] - deq) <= std::ldexp(e2m1_half_step(scaled), e));
    }
  }
}

void check_fp8(const float* x, int n, int stride, Fp8Format fmt) {
  std::vector<float> spread(static_cast<size_t>(n) * stride, 12345.f);
  for (int i = 0; i < n; ++i) spread[static_cast<size_t>(i) * stride] = x[i];
  uint8_t codes[kMxfp4Block], dense[kMxfp4Block];
  const float scale = fp8_quantize_block(spread.data(), n, stride, fmt, codes);
  const float dense_scale = fp8_quantize_block(x, n, 1, fmt, dense);
  FUZZ_CHECK(float_bits(scale) == float_bits(dense_scale) ||
             (std::isnan(scale) && std::isnan(dense_scale)));
  for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == dense[i]);
  const float amax = block_amax(x, n);
  if (!finite(amax)) {
    FUZZ_CHECK(std::isnan(scale));
    for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == (fmt == Fp8Format::kE4M3 ? 0x7F : 0x7E));
    return;
  }
  if (amax == 0) {
    FUZZ_CHECK(scale == 1.f);
    for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[i] == 0 || codes[i] == 0x80);
    return;
  }
  const double fmax = fmt == Fp8Format::kE4M3 ? kE4m3Max : kE5m2Max;
  FUZZ_CHECK(finite(scale) && scale >= 0);
  // Below about 5e-36 the FP32 scale amax / fmax is subnormal and fmax / amax overflows (clamped):
  // the documented loss of numerics.md section 9, outside the bound.
  if (amax / static_cast<float>(fmax) < 0x1p-126f) return;
  // Relative half step (3 or 2 mantissa bits) and half the smallest subnormal, in code units.
  const double rel = fmt == Fp8Format::kE4M3 ? 0x1p-4 : 0x1p-3;
  const double quantum = fmt == Fp8Format::kE4M3 ? 0x1p-10 : 0x1p-17;
  for (int i = 0; i < n; ++i) {
    const double deq = static_cast<double>(fp8_to_float(codes[i], fmt)) * scale;
    FUZZ_CHECK(std::isfinite(deq));
    const double xi = x[i];
    const double slack = 0x1p-20 * (std::fabs(xi) + std::fabs(deq)) + 0x1p-148;
    FUZZ_CHECK(std::fabs(xi - deq) <= rel * std::fabs(xi) + quantum * scale + slack);
    FUZZ_CHECK(std::fabs(fp8_to_float(codes[i], fmt)) <= fmax);
  }
}

// The row helpers over a [rows, cols] matrix (leading dimension ld) equal the block calls.
void check_rows(const std::vector<float>& v, int rows, int pad, float s_enc, Nvfp4ScaleRule nv,
                MxScaleRule mx) {
  const int64_t cols = static_cast<int64_t>(v.size()) / rows, ld = cols + pad;
  if (cols == 0) return;
  std::vector<float> x(rows * ld, 7.f);
  for (int r = 0; r < rows; ++r) std::memcpy(&x[r * ld], &v[r * cols], sizeof(float) * cols);
  for (int block : {kNvfp4Block, kMxfp4Block}) {
    const int64_t nb = (cols + block - 1) / block;
    std::vector<uint8_t> codes(rows * cols), scales(rows * nb);
    if (block == kNvfp4Block) {
      nvfp4_quantize_rows(x.data(), rows, cols, ld, s_enc, nv, codes.data(), scales.data());
    } else {
      mxfp4_quantize_rows(x.data(), rows, cols, ld, mx, codes.data(), scales.data());
    }
    for (int r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int n = static_cast<int>(std::min<int64_t>(block, cols - b * block));
        uint8_t want[kMxfp4Block];
        const float* src = &x[r * ld + b * block];
        const uint8_t s = block == kNvfp4Block ? nvfp4_quantize_block(src, n, s_enc, nv, want)
                                               : mxfp4_quantize_block(src, n, mx, want);
        FUZZ_CHECK(scales[r * nb + b] == s);
        for (int i = 0; i < n; ++i) FUZZ_CHECK(codes[r * cols + b * block + i] == want[i]);
      }
    }
    if (cols % 2 == 0) {
      std::vector<uint8_t> packed(rows * cols / 2), back(rows * cols);
      pack_e2m1_rows(codes.data(), rows, cols, packed.data());
      unpack_e2m1_rows(packed.data(), rows, cols, back.data());
      FUZZ_CHECK(back == codes);
    }
  }
}

}  // namespace
}  // namespace fp4attn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fp4attn;
  Reader in{data, size};
  const uint8_t kind = in.byte(), n_byte = in.byte(), mode = in.byte();
  const float raw_s_enc = bits_float(in.u32());
  const int exponent = static_cast<int8_t>(in.byte());
  // Values: raw FP32 bits (every special value) or int16 * 2^exponent (blocks with structure).
  std::vector<float> v;
  while (in.n > 0 && v.size() < 96) {
    if (mode & 1) {
      v.push_back(bits_float(in.u32()));
    } else {
      const int16_t m = static_cast<int16_t>(in.byte() | (in.byte() << 8));
      v.push_back(std::ldexp(static_cast<float>(m), exponent));
    }
  }
  const int block = (kind & 7) < 4 ? kNvfp4Block : kMxfp4Block;
  const int n = 1 + n_byte % block;
  std::vector<float> x(v.begin(), v.begin() + std::min<size_t>(v.size(), n));
  x.resize(n, 0.f);
  // s_enc: the tensor scale of the block itself (what the library computes) or the fuzzed one.
  const Nvfp4ScaleRule nv = kNvRules[kind & 3];
  const float s_enc = (mode & 2) ? raw_s_enc : nvfp4_tensor_scale(block_amax(x.data(), n), nv);
  const MxScaleRule mx = (kind & 1) ? MxScaleRule::kRoundUp : MxScaleRule::kOcpFloor;
  switch (kind & 7) {
    case 0:
    case 1:
    case 2:
    case 3:
      check_nvfp4(x.data(), n, s_enc, nv, (mode & 2) == 0);
      break;
    case 4:
    case 5:
      check_mxfp4(x.data(), n, mx);
      break;
    default:
      check_fp8(x.data(), n, 1 + (mode >> 2) % 3,
                (kind & 7) == 6 ? Fp8Format::kE4M3 : Fp8Format::kE5M2);
      break;
  }
  check_rows(v, 1 + (mode >> 4) % 3, (mode >> 6) & 1, s_enc, nv, mx);
  return 0;
}
