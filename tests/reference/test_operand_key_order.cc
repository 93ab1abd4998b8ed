// The V operand key-order contract (include/fp4attn/operands.h): inside every 16-key group,
// position p of a V^T row holds key 2(p >> 2) + (p & 1) + 8((p >> 1) & 1), the order in which the
// FP8 wgmma A operand wants the Q·K^T accumulator's keys. Checked against a table written out
// here (not the header's formula), for every recipe, on lengths that leave a padded tail.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/tensor.h"
#include "reference/golden_operands.h"

namespace fp4attn {
namespace {

// Key held at each position of a 16-key group: thread t of a quad reads positions 4t..4t+3 and
// holds keys {2t, 2t + 1, 2t + 8, 2t + 9} of the accumulator.
constexpr int kKeyAt[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};

static_assert(operand_v_key_at(0) == 0 && operand_v_key_at(2) == 8 && operand_v_key_at(15) == 15);
static_assert(operand_v_key_at(16 + 4) == 16 + 2 && operand_v_position_of(16 + 9) == 16 + 3);

TEST(OperandKeyOrder, HelpersMatchTheTableAndAreInverse) {
  std::vector<int> seen(16, 0);
  for (int p = 0; p < 16; ++p) {
    EXPECT_EQ(operand_v_key_at(p), kKeyAt[p]) << p;
    ++seen[kKeyAt[p]];
  }
  for (int k = 0; k < 16; ++k) EXPECT_EQ(seen[k], 1) << "table is not a bijection at key " << k;
  // Thread t's 4 positions hold exactly the accumulator's keys {2t, 2t+1, 2t+8, 2t+9}.
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(kKeyAt[4 * t], 2 * t);
    EXPECT_EQ(kKeyAt[4 * t + 1], 2 * t + 1);
    EXPECT_EQ(kKeyAt[4 * t + 2], 2 * t + 8);
    EXPECT_EQ(kKeyAt[4 * t + 3], 2 * t + 9);
  }
  // Groups stay in place; the inverse undoes the map on a long range.
  for (int64_t pos = 0; pos < 1024; ++pos) {
    const int64_t key = operand_v_key_at(pos);
    EXPECT_EQ(key, pos / 16 * 16 + kKeyAt[pos % 16]);
    EXPECT_EQ(operand_v_position_of(key), pos);
  }
}

// V [1, s, h, d] of BF16-exact values (FP32 storage), channel magnitudes spread over binades.
std::vector<float> random_v(int64_t s, int64_t h, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(s * h * d);
  for (int64_t i = 0; i < s * h * d; ++i) {
    const int binade = static_cast<int>(i % d % 9) - 4;
    v[i] = bf16_bits_to_float(float_to_bf16_bits(std::ldexp(normal(rng), binade)));
  }
  return v;
}

// Every position of every V^T row holds the code of the golden operand value of the key the
// table assigns to it (padding keys: 0), every recipe. A natural-order layout fails this on
// random data (neighbouring keys have different codes).
TEST(OperandKeyOrder, HostVFollowsTheContractForEveryRecipe) {
  const int64_t h = 2, d = 64;
  for (int64_t s : {1, 17, 333}) {
    std::vector<float> v = random_v(s, h, d, static_cast<uint32_t>(s));
    const TensorView x = make_view(v.data(), DType::kF32, {1, s, h, d});
    const int64_t pitch = operand_v_pitch(s);
    for (Recipe r : kAllRecipes) {
      SCOPED_TRACE(std::string(recipe_name(r)) + " s=" + std::to_string(s));
      const bool bf16 = r == Recipe::kBf16;
      const int64_t width = bf16 ? 2 : 1;
      std::vector<uint8_t> data(h * d * pitch * width, 0xAB);
      std::vector<float> scale(h * d, -1.f);
      ASSERT_TRUE(quantize_operand_host(
                      x, r, OperandRole::kV, OperandOptions{},
                      make_view(data.data(), bf16 ? DType::kBF16 : DType::kE4M3, {1, h, d, pitch}),
                      make_view(scale.data(), DType::kF32, {1, h, d}), TensorView{})
                      .ok());
      int failures = 0;
      for (int64_t hi = 0; hi < h; ++hi) {
        const golden::Operand op =
            golden::prepare_v(golden::gather_head(x, 0, hi), r, Emulation::kFoldedE4M3, 0.f);
        for (int64_t c = 0; c < d; ++c) {
          EXPECT_EQ(scale[hi * d + c], static_cast<float>(op.factor[c]));
          for (int64_t pos = 0; pos < pitch && failures < 8; ++pos) {
            const int64_t key = pos / 16 * 16 + kKeyAt[pos % 16];
            const int64_t at = (hi * d + c) * pitch + pos;
            uint32_t got, want = 0;
            if (bf16) {
              got = reinterpret_cast<const uint16_t*>(data.data())[at];
              if (key < s) want = float_to_bf16_bits(static_cast<float>(op.val[key * d + c]));
            } else {
              got = data[at];
              if (key < s) want = float_to_e4m3(static_cast<float>(op.val[key * d + c]));
            }
            if (got != want) {
              ADD_FAILURE() << "head " << hi << " channel " << c << " position " << pos << " (key "
                            << key << (key < s ? "" : ", padding") << "): 0x" << std::hex << got
                            << " want 0x" << want << std::dec;
              ++failures;
            }
          }
        }
      }
    }
  }
}

// The plainest form of the contract: V[t][c] = t + 1 through the bf16 recipe (exact), so each
// position spells out the key it holds.
TEST(OperandKeyOrder, Bf16PositionsSpellTheirKeys) {
  const int64_t s = 77, h = 1, d = 64, pitch = operand_v_pitch(s);
  std::vector<float> v(s * d);
  for (int64_t t = 0; t < s; ++t)
    for (int64_t c = 0; c < d; ++c) v[t * d + c] = static_cast<float>(t + 1);
  std::vector<uint16_t> data(d * pitch, 0xABAB);
  std::vector<float> scale(d);
  ASSERT_TRUE(quantize_operand_host(make_view(v.data(), DType::kF32, {1, s, h, d}), Recipe::kBf16,
                                    OperandRole::kV, OperandOptions{},
                                    make_view(data.data(), DType::kBF16, {1, h, d, pitch}),
                                    make_view(scale.data(), DType::kF32, {1, h, d}), TensorView{})
                  .ok());
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t pos = 0; pos < pitch; ++pos) {
      const int64_t key = pos / 16 * 16 + kKeyAt[pos % 16];
      const float want = key < s ? static_cast<float>(key + 1) : 0.f;
      ASSERT_EQ(bf16_bits_to_float(data[c * pitch + pos]), want)
          << "channel " << c << " pos " << pos;
    }
  }
}

}  // namespace
}  // namespace fp4attn
