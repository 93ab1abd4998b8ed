// The Blackwell 128x4 swizzled scale layout: hand-checked offsets, bijection, zero padding and
// round trips on odd shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "fp4attn/scale_layout.h"

namespace fp4attn {
namespace {

TEST(ScaleLayout, Sizes) {
  EXPECT_EQ(swizzled_scale_bytes(1, 1), 512);
  EXPECT_EQ(swizzled_scale_bytes(128, 4), 512);
  EXPECT_EQ(swizzled_scale_bytes(129, 5), 256 * 8);
  EXPECT_EQ(swizzled_scale_bytes(0, 4), 0);
}

TEST(ScaleLayout, HandCheckedOffsets) {
  // Intra-atom: (m % 32) * 16 + ((m / 32) % 4) * 4 + (k % 4).
  EXPECT_EQ(swizzled_scale_offset(0, 0, 4), 0);
  EXPECT_EQ(swizzled_scale_offset(0, 1, 4), 1);
  EXPECT_EQ(swizzled_scale_offset(1, 0, 4), 16);
  EXPECT_EQ(swizzled_scale_offset(32, 0, 4), 4);
  EXPECT_EQ(swizzled_scale_offset(33, 2, 4), 16 + 4 + 2);
  EXPECT_EQ(swizzled_scale_offset(100, 3, 4), 4 * 16 + 3 * 4 + 3);
  EXPECT_EQ(swizzled_scale_offset(127, 3, 4), 511);
  // Atoms: (m / 128) * ceil(K / 4) + k / 4, scale-column atoms fastest.
  EXPECT_EQ(swizzled_scale_offset(128, 0, 4), 512);
  EXPECT_EQ(swizzled_scale_offset(0, 4, 8), 512);
  EXPECT_EQ(swizzled_scale_offset(128, 0, 8), 1024);
  EXPECT_EQ(swizzled_scale_offset(128, 0, 5), 1024) << "5 scale columns pad to 8";
  EXPECT_EQ(swizzled_scale_offset(300, 6, 7), (2 * 2 + 1) * 512 + 12 * 16 + 1 * 4 + 2);
}

TEST(ScaleLayout, OffsetsAreABijectionOntoThePaddedBuffer) {
  for (int64_t rows : {128, 256}) {
    for (int64_t cols : {4, 8}) {
      std::set<int64_t> seen;
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t k = 0; k < cols; ++k) seen.insert(swizzled_scale_offset(m, k, cols));
      EXPECT_EQ(static_cast<int64_t>(seen.size()), rows * cols);
      EXPECT_EQ(*seen.rbegin(), swizzled_scale_bytes(rows, cols) - 1);
    }
  }
}

TEST(ScaleLayout, RoundTripOddShapesWithZeroPadding) {
  for (int64_t rows : {1, 31, 127, 128, 129, 300}) {
    for (int64_t cols : {1, 3, 4, 5, 7, 9}) {
      std::vector<uint8_t> src(rows * cols);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(1 + i % 255);  // != 0
      std::vector<uint8_t> sw(swizzled_scale_bytes(rows, cols), 0xCD), back(rows * cols);
      scales_to_swizzled(src.data(), rows, cols, sw.data());
      std::vector<bool> used(sw.size(), false);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t k = 0; k < cols; ++k) {
          const int64_t off = swizzled_scale_offset(m, k, cols);
          ASSERT_EQ(sw[off], src[m * cols + k]);
          used[off] = true;
        }
      }
      for (size_t i = 0; i < sw.size(); ++i) {
        if (!used[i]) {
          ASSERT_EQ(sw[i], 0) << "padding at " << i << " rows " << rows;
        }
      }
      scales_from_swizzled(sw.data(), rows, cols, back.data());
      EXPECT_EQ(back, src) << rows << "x" << cols;
      // The other way: swizzled (padding zero) -> row-major -> swizzled is the identity.
      std::vector<uint8_t> again(sw.size(), 0xCD);
      scales_to_swizzled(back.data(), rows, cols, again.data());
      EXPECT_EQ(again, sw);
    }
  }
}

}  // namespace
}  // namespace fp4attn
