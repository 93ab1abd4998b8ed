// The integer side of the paged prefill repack kernel (src/cuda/paged/prefill_bits.h), on the
// host: the NVFP4 fold through the per-block byte table for every (code, scale) pair at every
// element position, the prmt emulation's sign mode, the 4 x 4 byte transpose and the V quad's
// key order. The kernel runs the same functions (prmt and cvt in hardware on the device).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/paged/prefill_bits.h"
#include "fp4attn/golden/paged_prefill.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"

namespace fp4attn {
namespace {

TEST(PrefillBits, FoldMatchesTheReferenceForEveryCodeScaleAndPosition) {
  std::mt19937 rng(3);
  int64_t exact = 0, nonzero = 0;
  for (int sc = 0; sc < 256; ++sc) {
    const uint8_t scale = static_cast<uint8_t>(sc);
    // The reference itself against its definition (NaN scales aside).
    for (int code = 0; code < 16; ++code) {
      const uint8_t want = paged_prefill_fold_nvfp4(static_cast<uint8_t>(code), scale);
      if ((scale & 0x7F) == 0x7F) {
        ASSERT_EQ(want, 0x7F);
        continue;
      }
      const float prod = e2m1_to_float(static_cast<uint8_t>(code)) * e4m3_to_float(scale);
      ASSERT_EQ(want, float_to_e4m3(prod / 8.f)) << sc << " " << code;
      if (prod != 0.f) {
        ++nonzero;
        exact += e4m3_to_float(want) == prod / 8.f;
      }
    }
    for (int pos = 0; pos < 16; ++pos) {
      for (int code = 0; code < 16; ++code) {
        uint8_t codes[16];
        for (int c = 0; c < 16; ++c) codes[c] = static_cast<uint8_t>(rng() & 0xF);
        codes[pos] = static_cast<uint8_t>(code);
        uint32_t w[2] = {0, 0};
        for (int c = 0; c < 16; ++c) w[c / 8] |= static_cast<uint32_t>(codes[c]) << (4 * (c % 8));
        uint32_t out[4];
        paged::fold16(w[0], w[1], scale, out);
        for (int c = 0; c < 16; ++c) {
          const uint8_t got = static_cast<uint8_t>(out[c / 4] >> (8 * (c % 4)));
          ASSERT_EQ(got, paged_prefill_fold_nvfp4(codes[c], scale))
              << "scale " << sc << " element " << c << " code " << int(codes[c]);
        }
      }
    }
  }
  // Folding rounds some products (numerics.md §3: about a quarter of the nonzero ones).
  EXPECT_GT(exact, nonzero / 2);
  EXPECT_LT(exact, nonzero);
}

TEST(PrefillBits, PrmtSignModeAndTranspose) {
  // Selector nibble 8 + i: the sign of byte i replicated.
  EXPECT_EQ(paged::prmt_sign(0x80017F00u, 0u, 0xBA98u), 0xFF000000u);
  EXPECT_EQ(paged::prmt_sign(0x44332211u, 0x88776655u, 0x7654u), 0x88776655u);
  std::mt19937 rng(5);
  for (int rep = 0; rep < 1000; ++rep) {
    uint32_t x[4], out[4];
    for (auto& v : x) v = static_cast<uint32_t>(rng());
    paged::transpose4x4(x, out);
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 4; ++k) {
        ASSERT_EQ((out[j] >> (8 * k)) & 0xFF, (x[k] >> (8 * j)) & 0xFF);
      }
    }
  }
}

TEST(PrefillBits, VQuadKeysAreTheOperandKeyOrder) {
  for (int q = 0; q < 4; ++q) {
    for (int k = 0; k < 4; ++k) EXPECT_EQ(paged::v_quad_key(q, k), operand_v_key_at(4 * q + k));
  }
}

}  // namespace
}  // namespace fp4attn
