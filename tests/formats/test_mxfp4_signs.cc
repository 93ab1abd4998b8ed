// Signs of the MXFP4 fast paths of the GPU quantizers, checked on the host through the very
// FP4ATTN_HD functions the kernels call:
//   * packed::mxfp4_block_codes (packed_quantize.cu mxfp4_packed_kernel): magnitudes by
//     mxfp4_block_mag, signs from the 16-bit input bits (sign_nibbles8);
//   * operand_fast::mxfp4_operand_block (operand_qk.cu quantize_kernel, Mode::kMx): magnitudes
//     folded through mxfp4_fold_row by PRMT, signs from the values' top bytes (fold8_mag), plain
//     inputs and smoothed-K differences;
// against mxfp4_quantize_block (+ pack_e2m1x2, or the fold E4M3(e2m1 * 2^(scale - 127 - t))),
// over random and adversarial blocks of BF16 and FP16 inputs, each block under several sign
// patterns: none, all, every single position negative, alternating, random. The first device run
// of these paths lost the signs of nonzero blocks whose scale code is 0x00 (2^-127: BF16
// subnormal blocks) because the sign mask was taken from the scale code; the kTinyBf16 and
// kBf16Subnormal patterns reproduce that. Also the sign gathers (sign_nibbles8, sign_nibbles_f8,
// sign_bytes4_16, sign_bytes4_f32) and fold8_mag with one negative element in each position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

constexpr int kN = kMxfp4Block;

struct Dt {
  bool f16;
  const char* name;
};
constexpr Dt kBf16{false, "bf16"}, kF16{true, "fp16"};

float to_float(uint16_t b, const Dt& dt) {
  return dt.f16 ? f16_bits_to_float(b) : bf16_bits_to_float(b);
}
uint16_t to_bits(float f, const Dt& dt) {
  return dt.f16 ? float_to_f16_bits(f) : float_to_bf16_bits(f);
}

// Magnitude patterns of a block (sign bits are applied afterwards).
enum Pattern {
  kNormalWide,     // normal(0, 1) * 2^e over the dtype's whole range
  kTiesAt6,        // E2M1 ties at amax 6, +- 1 ulp
  kBf16Subnormal,  // BF16: subnormals only (scale code 0x00 = 2^-127, codes nonzero)
  kTinyBf16,       // BF16: normals around 2^-127 .. 2^-124 (the 0x00 / 0x01 scale boundary)
  kF16Subnormal,   // FP16: subnormals only
  kZerosAndOne,    // zeros and one nonzero value (the zeros' codes are +-0 by their signs)
  kAllZero,        // every value 0 (signs must vanish: codes +0)
  kOneBig,         // one value far above the rest (most codes round to +-0)
  kSaturate,       // the largest finite values
  kNaN,            // a NaN in the block
  kInf,            // an Inf in the block
  kSmallInts,      // small integers times 2^e (exact codes)
  kPatterns
};

std::vector<uint16_t> magnitudes(Pattern pat, const Dt& dt, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> m(kN);
  const uint16_t max_finite = dt.f16 ? 0x7BFF : 0x7F7F, inf = dt.f16 ? 0x7C00 : 0x7F80,
                 nan = dt.f16 ? 0x7E00 : 0x7FC0, sub_max = dt.f16 ? 0x03FF : 0x007F;
  const int e_lo = dt.f16 ? -24 : -133, e_hi = dt.f16 ? 15 : 127;
  const int e = e_lo + static_cast<int>(rng() % static_cast<uint64_t>(e_hi - e_lo));
  const float ties[8] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f};
  for (int i = 0; i < kN; ++i) {
    uint16_t v = 0;
    switch (pat) {
      case kNormalWide:
        v = to_bits(std::ldexp(normal(rng), e), dt);
        break;
      case kTiesAt6:
        v = to_bits(i == 0 ? 6.f : ties[i % 8], dt);
        if (i != 0 && rng() % 3 == 0) v = static_cast<uint16_t>(v + (rng() % 2 ? 1 : -1));
        break;
      case kBf16Subnormal:
      case kF16Subnormal:
        v = static_cast<uint16_t>(rng() % (sub_max + 1));
        break;
      case kTinyBf16:
        v = to_bits(std::ldexp(1.f + static_cast<float>(rng() % 128) / 128.f,
                               -127 + static_cast<int>(rng() % 4)),
                    dt);
        if (rng() % 4 == 0) v = static_cast<uint16_t>(rng() % (sub_max + 1));
        break;
      case kZerosAndOne:
        v = i == static_cast<int>(rng() % kN) ? to_bits(std::ldexp(1.f, e), dt) : 0;
        break;
      case kAllZero:
        v = 0;
        break;
      case kOneBig:
        v = to_bits(i == 7 ? std::ldexp(1.f, e) : std::ldexp(normal(rng), e - 6), dt);
        break;
      case kSaturate:
        v = static_cast<uint16_t>(i % 3 == 0 ? max_finite : max_finite - rng() % 64);
        break;
      case kNaN:
        v = i == 5 ? nan : to_bits(normal(rng), dt);
        break;
      case kInf:
        v = i == 9 ? inf : to_bits(normal(rng), dt);
        break;
      case kSmallInts:
        v = to_bits(static_cast<float>(rng() % 7) * std::ldexp(1.f, e / 2), dt);
        break;
      default:
        break;
    }
    m[i] = static_cast<uint16_t>(v & 0x7FFF);
  }
  return m;
}

// Sign patterns: 0 none, 1 all, 2..33 only element (s - 2), 34 alternating, 35+ random.
constexpr int kSignPatterns = 38;
uint32_t sign_bits(int s, std::mt19937_64& rng) {
  if (s == 0) return 0;
  if (s == 1) return 0xFFFFFFFFu;
  if (s < 34) return 1u << (s - 2);
  if (s == 34) return 0xAAAAAAAAu;
  return static_cast<uint32_t>(rng());
}

// The 32 values with signs applied (bit i of `signs` negates element i, zeros become -0).
std::vector<uint16_t> with_signs(const std::vector<uint16_t>& mag, uint32_t signs) {
  std::vector<uint16_t> b(mag);
  for (int i = 0; i < kN; ++i) b[i] = static_cast<uint16_t>(b[i] | (((signs >> i) & 1u) << 15));
  return b;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The packed quantizer's block against mxfp4_quantize_block + pack_e2m1x2.
TEST(Mxfp4SignsHost, PackedBlockCodesEqualReferenceAllSignPositions) {
  std::mt19937_64 rng(4601);
  int64_t blocks = 0, bad = 0, signed_scale0 = 0;
  for (const Dt& dt : {kBf16, kF16}) {
    for (int rep = 0; rep < 150; ++rep) {
      for (int pat = 0; pat < kPatterns; ++pat) {
        const std::vector<uint16_t> mag = magnitudes(static_cast<Pattern>(pat), dt, rng);
        for (int sp = 0; sp < kSignPatterns; ++sp) {
          const std::vector<uint16_t> b = with_signs(mag, sign_bits(sp, rng));
          float x[kN];
          uint16_t amax_bits = 0;  // the kernel's amax: max |.| of the 16-bit bits
          for (int i = 0; i < kN; ++i) {
            x[i] = to_float(b[i], dt);
            amax_bits = std::max<uint16_t>(amax_bits, b[i] & 0x7FFF);
          }
          const float amax = to_float(amax_bits, dt);
          uint32_t in[16];
          for (int k = 0; k < 16; ++k) in[k] = b[2 * k] | (uint32_t{b[2 * k + 1]} << 16);
          for (MxScaleRule rule : {MxScaleRule::kOcpFloor, MxScaleRule::kRoundUp}) {
            uint32_t w[4];
            const uint32_t s =
                rule == MxScaleRule::kRoundUp
                    ? packed::mxfp4_block_codes<MxScaleRule::kRoundUp>(x, amax, in, w)
                    : packed::mxfp4_block_codes<MxScaleRule::kOcpFloor>(x, amax, in, w);
            uint8_t codes[kN];
            const uint8_t ref_s = mxfp4_quantize_block(x, kN, rule, codes);
            uint8_t want[16], got[16];
            for (int j = 0; j < 16; ++j) want[j] = pack_e2m1x2(codes[2 * j], codes[2 * j + 1]);
            std::memcpy(got, w, 16);
            ++blocks;
            if (ref_s == 0 && amax != 0.f) ++signed_scale0;
            if (s != ref_s || std::memcmp(got, want, 16) != 0) {
              if (++bad <= 5) {
                int j = 0;
                while (j < 16 && got[j] == want[j]) ++j;
                ADD_FAILURE() << dt.name << " pattern " << pat << " signs " << sp << " rule "
                              << static_cast<int>(rule) << ": scale " << s << " want " << int{ref_s}
                              << ", byte " << j << " got " << hex(got[j % 16]) << " want "
                              << hex(want[j % 16]);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << blocks << " blocks";
  EXPECT_GT(signed_scale0, 1000) << "nonzero blocks with scale code 0x00 exercised";
}

// Reference folded bytes of one operand block: E4M3(e2m1 * 2^(scale - 127 - t)) (the golden fold,
// golden_operands.cc, in double then FP32 as operands_host.cc stores it), 0x7F for NaN blocks.
void reference_operand_bytes(const float (&v)[kN], int t, uint8_t (&out)[kN], uint8_t* scale) {
  uint8_t codes[kN];
  *scale = mxfp4_quantize_block(v, kN, MxScaleRule::kRoundUp, codes);
  for (int i = 0; i < kN; ++i) {
    out[i] = *scale == 0xFF ? 0x7F
                            : float_to_e4m3(static_cast<float>(
                                  std::ldexp(static_cast<double>(e2m1_to_float(codes[i])),
                                             static_cast<int>(*scale) - 127 - t)));
  }
}

// The operand-Q/K block (plain and smoothed) against the reference fold, slice offsets t from
// the block's own (k = 6) to far below (the fold rows' clamp at k = -248).
TEST(Mxfp4SignsHost, OperandBlockEqualsReferenceFoldAllSignPositions) {
  std::mt19937_64 rng(4602);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint64_t> rows(operand_fast::kMxFoldRows);
  for (int i = 0; i < operand_fast::kMxFoldRows; ++i) {
    rows[i] = operand_fast::mxfp4_fold_row(i + operand_fast::kMxFoldMinK);
  }
  const auto row = [&](int i) { return rows.at(static_cast<size_t>(i)); };
  const int deltas[] = {0, 1, 2, 5, 9, 13, 40, 131, 254, 300};
  int64_t blocks = 0, bad = 0, signed_scale0 = 0;
  for (const Dt& dt : {kBf16, kF16}) {
    for (int rep = 0; rep < 60; ++rep) {
      for (int pat = 0; pat < kPatterns; ++pat) {
        const std::vector<uint16_t> mag = magnitudes(static_cast<Pattern>(pat), dt, rng);
        for (int sp = 0; sp < kSignPatterns; ++sp) {
          const std::vector<uint16_t> b = with_signs(mag, sign_bits(sp, rng));
          for (int smooth = 0; smooth < 2; ++smooth) {
            // Smoothed K: v = x - mu in FP32 (quantize_kernel's unpack_plain); mu mixes exact
            // copies of x (+0 differences), small offsets (tiny differences of either sign) and
            // random means.
            float v[kN];
            for (int i = 0; i < kN; ++i) {
              const float x = to_float(b[i], dt);
              float mu = 0.f;
              if (smooth) {
                const int kind = static_cast<int>(rng() % 4);
                mu = kind == 0   ? x
                     : kind == 1 ? x + std::ldexp(normal(rng), -140)
                     : kind == 2 ? std::ldexp(normal(rng), -126)
                                 : normal(rng) * std::fabs(x);
                if (!std::isfinite(mu)) mu = 0.f;
              }
              v[i] = smooth ? x - mu : x;
            }
            const float amax = block_amax(v, kN);
            uint8_t want[kN];
            uint8_t sc;
            reference_operand_bytes(v, 0, want, &sc);
            for (int delta : deltas) {
              const int t = static_cast<int>(sc) - 133 + delta;  // k = 6 - delta
              if (t > 121 && sc != 0xFF) continue;               // t = emax - 6 <= 121
              reference_operand_bytes(v, t, want, &sc);
              uint32_t o[8];
              const uint32_t got_sc = operand_fast::mxfp4_operand_block(v, amax, t, row, o);
              uint8_t got[kN];
              std::memcpy(got, o, kN);
              ++blocks;
              if (sc == 0 && amax != 0.f) ++signed_scale0;
              if (got_sc != sc || std::memcmp(got, want, kN) != 0) {
                if (++bad <= 5) {
                  int j = 0;
                  while (j < kN && got[j] == want[j]) ++j;
                  ADD_FAILURE() << dt.name << " pattern " << pat << " signs " << sp << " smooth "
                                << smooth << " t " << t << ": scale " << got_sc << " want "
                                << int{sc} << ", byte " << j << " got " << int{got[j % kN]}
                                << " want " << int{want[j % kN]};
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << blocks << " blocks";
  EXPECT_GT(signed_scale0, 1000) << "nonzero blocks with scale code 0x00 exercised";
}

// The sign gathers and fold8_mag, one negative element in each position (and none, all), on
// 16-bit words and their floats: the element -> nibble / byte maps the kernels rely on.
TEST(Mxfp4SignsHost, SignGathersEveryPosition) {
  std::mt19937_64 rng(4603);
  for (const Dt& dt : {kBf16, kF16}) {
    for (int rep = 0; rep < 200; ++rep) {
      for (int s = 0; s < 11; ++s) {
        // s: 0 none, 1 all, 2..9 element s - 2 only, 10 random.
        const uint32_t neg = s == 0 ? 0u : s == 1 ? 0xFFu : s < 10 ? 1u << (s - 2) : rng() & 0xFFu;
        uint16_t b[8];
        float x[8];
        for (int i = 0; i < 8; ++i) {
          b[i] = static_cast<uint16_t>((rng() & 0x7FFF) % (dt.f16 ? 0x7C00 : 0x7F80));
          if (rep % 4 == 0) b[i] = 0;  // +-0
          b[i] = static_cast<uint16_t>(b[i] | (((neg >> i) & 1u) << 15));
          x[i] = to_float(b[i], dt);
        }
        uint32_t w[4];
        for (int k = 0; k < 4; ++k) w[k] = b[2 * k] | (uint32_t{b[2 * k + 1]} << 16);
        uint32_t nib = 0, bytes_lo = 0, bytes_hi = 0;
        for (int i = 0; i < 8; ++i) {
          nib |= ((neg >> i) & 1u) << (4 * i + 3);
          (i < 4 ? bytes_lo : bytes_hi) |= ((neg >> i) & 1u) << (8 * (i % 4) + 7);
        }
        EXPECT_EQ(packed::sign_nibbles8(w[0], w[1], w[2], w[3]) & 0x88888888u, nib);
        EXPECT_EQ(operand_fast::sign_nibbles_f8(x), nib);
        EXPECT_EQ(operand_fast::sign_bytes4_16(w[0], w[1]) & 0x80808080u, bytes_lo);
        EXPECT_EQ(operand_fast::sign_bytes4_16(w[2], w[3]) & 0x80808080u, bytes_hi);
        EXPECT_EQ(operand_fast::sign_bytes4_f32(x) & 0x80808080u, bytes_lo);
        EXPECT_EQ(operand_fast::sign_bytes4_f32(x + 4) & 0x80808080u, bytes_hi);
        // fold8_mag: byte i = row byte mag_i, XOR the sign of element i (unless smask is 0).
        uint32_t mag = 0;
        for (int i = 0; i < 8; ++i) mag |= static_cast<uint32_t>(rng() % 8) << (4 * i);
        const uint64_t r = operand_fast::mxfp4_fold_row(static_cast<int>(rng() % 40) - 30);
        for (uint32_t smask : {0x80808080u, 0u}) {
          uint32_t o0, o1;
          operand_fast::fold8_mag(mag, static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32),
                                  operand_fast::sign_bytes4_16(w[0], w[1]),
                                  operand_fast::sign_bytes4_16(w[2], w[3]), smask, o0, o1);
          for (int i = 0; i < 8; ++i) {
            const uint32_t got = ((i < 4 ? o0 : o1) >> (8 * (i % 4))) & 0xFFu;
            const uint32_t m = (mag >> (4 * i)) & 7u;
            const uint32_t want = static_cast<uint32_t>((r >> (8 * m)) & 0xFFu) ^
                                  (smask != 0 && ((neg >> i) & 1u) ? 0x80u : 0u);
            EXPECT_EQ(got, want) << dt.name << " element " << i << " signs " << hex(neg);
          }
        }
      }
    }
  }
}

// mxfp4_block_signed: the sign mask is a function of amax, not of the scale code.
TEST(Mxfp4SignsHost, BlockSignedByAmax) {
  EXPECT_FALSE(packed::mxfp4_block_signed(0.f));
  EXPECT_FALSE(packed::mxfp4_block_signed(-0.f));
  EXPECT_FALSE(packed::mxfp4_block_signed(INFINITY));
  EXPECT_FALSE(packed::mxfp4_block_signed(NAN));
  EXPECT_FALSE(packed::mxfp4_block_signed(-NAN));
  EXPECT_TRUE(packed::mxfp4_block_signed(bits_float(1u)));         // 2^-149: scale 0x00
  EXPECT_TRUE(packed::mxfp4_block_signed(std::ldexp(1.f, -125)));  // scale 0x00
  EXPECT_TRUE(packed::mxfp4_block_signed(3.4028235e38f));
  const float tiny = bf16_bits_to_float(0x8040);  // -2^-127, a BF16 subnormal
  uint8_t codes[1];
  EXPECT_EQ(mxfp4_quantize_block(&tiny, 1, MxScaleRule::kRoundUp, codes), 0x00);
  EXPECT_EQ(codes[0], 0xAu);  // -1.0 under the scale code 0x00 (2^-127): a signed code
}

}  // namespace
}  // namespace fp4attn
