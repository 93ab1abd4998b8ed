// Host reference of the kernel operands (include/fp4attn/operands.h): layouts, padding, the
// exactness of the nvfp4-hx fold against the NVFP4 quantizer, smoothing and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "harness/suite.h"

namespace fp4attn {
namespace {

struct Host {
  std::vector<uint8_t> data;
  std::vector<float> scale, mean;
};

Host run(std::vector<float>& x, int64_t b, int64_t s, int64_t h, int64_t d, Recipe r,
         OperandRole role, OperandOptions opt = {}) {
  Host out;
  const bool v = role == OperandRole::kV;
  const int64_t cols = v ? operand_v_pitch(s) : d, rows = v ? d : s;
  const int64_t width = r == Recipe::kBf16 ? 2 : 1;
  out.data.assign(b * h * rows * cols * width, 0xAB);
  out.scale.assign(b * h * (v ? d : operand_scale_tiles(s)), -1.f);
  out.mean.assign(b * h * d, -1.f);
  const DType code = r == Recipe::kBf16 ? DType::kBF16 : DType::kE4M3;
  TensorView data = v ? make_view(out.data.data(), code, {b, h, d, operand_v_pitch(s)})
                      : make_view(out.data.data(), code, {b, h, s, d});
  TensorView scale = v ? make_view(out.scale.data(), DType::kF32, {b, h, d})
                       : make_view(out.scale.data(), DType::kF32, {b, h, operand_scale_tiles(s)});
  TensorView mean =
      opt.smooth_k ? make_view(out.mean.data(), DType::kF32, {b, h, d}) : TensorView{};
  Status st = quantize_operand_host(make_view(x.data(), DType::kF32, {b, s, h, d}), r, role, opt,
                                    data, scale, mean);
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

TEST(OperandsHost, VIsTransposedAndPaddedWithZeros) {
  const int64_t b = 2, s = 37, h = 3, d = 64;
  SuiteInputs in = make_inputs(InputKind::kGaussian, b, s, s, h, h, d, 1);
  Host v = run(in.v, b, s, h, d, Recipe::kFp8, OperandRole::kV);
  const int64_t pitch = operand_v_pitch(s);
  EXPECT_EQ(pitch, 48);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    for (int64_t c = 0; c < d; ++c) {
      const float sc = v.scale[bh * d + c];
      for (int64_t t = 0; t < pitch; ++t) {  // key t (its position: operands.h)
        const uint8_t code = v.data[(bh * d + c) * pitch + operand_v_position_of(t)];
        if (t >= s) {
          EXPECT_EQ(code, 0) << "padding";
          continue;
        }
        const float x = in.v[((bh / h * s + t) * h + bh % h) * d + c];
        // Per-channel FP8: within half an E4M3 step (relative 2^-4) or the subnormal quantum.
        const double err = std::fabs(e4m3_to_float(code) * sc - x);
        EXPECT_LE(err, std::fabs(x) / 16 + sc * std::ldexp(1.0, -10)) << c << " " << t;
      }
    }
  }
}

// nvfp4-hx folds exactly: data * scale equals the NVFP4 dequantized value of the quantizer's
// restricted-scale output, for every element.
TEST(OperandsHost, RestrictedNvfp4FoldEqualsTheQuantizer) {
  const int64_t b = 1, s = 130, h = 2, d = 128;
  SuiteInputs in = make_inputs(InputKind::kOutlierChannels, b, s, s, h, h, d, 2);
  Host k = run(in.k, b, s, h, d, Recipe::kNvfp4Hx, OperandRole::kK);
  for (int64_t hi = 0; hi < h; ++hi) {
    std::vector<float> slice(s * d);
    float amax = 0;
    for (int64_t t = 0; t < s; ++t)
      for (int64_t c = 0; c < d; ++c) {
        slice[t * d + c] = in.k[(t * h + hi) * d + c];
        amax = std::max(amax, std::fabs(slice[t * d + c]));
      }
    const float s_enc = nvfp4_tensor_scale(amax, Nvfp4ScaleRule::kRestricted);
    std::vector<uint8_t> codes(s * d), scales(s * d / 16);
    nvfp4_quantize_rows(slice.data(), s, d, d, s_enc, Nvfp4ScaleRule::kRestricted, codes.data(),
                        scales.data());
    for (int64_t t = 0; t < s; ++t) {
      const float factor = k.scale[hi * operand_scale_tiles(s) + t / kOperandTileTokens];
      EXPECT_EQ(factor, 8.f / s_enc);
      for (int64_t c = 0; c < d; ++c) {
        const double folded = double(e4m3_to_float(k.data[(hi * s + t) * d + c])) * 8;
        const double exact =
            double(e2m1_to_float(codes[t * d + c])) * e4m3_to_float(scales[t * d / 16 + c / 16]);
        ASSERT_EQ(folded, exact) << "t=" << t << " c=" << c;
      }
    }
  }
}

TEST(OperandsHost, Bf16RecipeKeepsTheInputBits) {
  const int64_t b = 1, s = 20, h = 1, d = 64;
  SuiteInputs in = make_inputs(InputKind::kGaussian, b, s, s, h, h, d, 3);
  Host q = run(in.q, b, s, h, d, Recipe::kBf16, OperandRole::kQ);
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(q.data.data());
  for (int64_t i = 0; i < s * d; ++i) EXPECT_EQ(bf16_bits_to_float(bits[i]), in.q[i]);
  EXPECT_EQ(q.scale[0], 1.f);
}

TEST(OperandsHost, SmoothingWritesTheMeanAndQuantizesTheDifference) {
  const int64_t b = 1, s = 64, h = 1, d = 64;
  SuiteInputs in = make_inputs(InputKind::kOutlierChannels, b, s, s, h, h, d, 4);
  OperandOptions opt;
  opt.smooth_k = true;
  Host smooth = run(in.k, b, s, h, d, Recipe::kFp8, OperandRole::kK, opt);
  std::vector<float> diff(in.k.size());
  for (int64_t c = 0; c < d; ++c) {
    double sum = 0;
    for (int64_t t = 0; t < s; ++t) sum += in.k[t * d + c];
    const float mean = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(sum / s)));
    EXPECT_EQ(smooth.mean[c], mean);
    for (int64_t t = 0; t < s; ++t) diff[t * d + c] = in.k[t * d + c] - mean;
  }
  Host plain = run(diff, b, s, h, d, Recipe::kFp8, OperandRole::kK);
  EXPECT_EQ(smooth.data, plain.data);
  EXPECT_EQ(smooth.scale, plain.scale);
}

TEST(OperandsHost, RejectsBadArguments) {
  std::vector<float> x(2 * 8 * 96), scale(64);
  std::vector<uint8_t> data(2 * 8 * 96);
  auto call = [&](TensorView xv, TensorView dv, TensorView sv, OperandRole role,
                  OperandOptions opt = {}) {
    return quantize_operand_host(xv, Recipe::kNvfp4, role, opt, dv, sv, TensorView{}).message();
  };
  TensorView x96 = make_view(x.data(), DType::kF32, {1, 8, 2, 96});
  EXPECT_NE(call(x96, {}, {}, OperandRole::kQ).find("x: head_dim 96 is not supported"),
            std::string::npos);
  TensorView x64 = make_view(x.data(), DType::kF32, {1, 8, 2, 64});
  TensorView wrong = make_view(data.data(), DType::kE4M3, {1, 8, 2, 64});  // BSHD, not BHSD
  TensorView sc = make_view(scale.data(), DType::kF32, {1, 2, 1});
  EXPECT_NE(call(x64, wrong, sc, OperandRole::kQ).find("data: expected a contiguous"),
            std::string::npos);
  TensorView good = make_view(data.data(), DType::kE4M3, {1, 2, 8, 64});
  OperandOptions smooth;
  smooth.smooth_k = true;
  EXPECT_NE(call(x64, good, sc, OperandRole::kQ, smooth).find("smooth_k: only the K operand"),
            std::string::npos);
  EXPECT_NE(call(make_view(x.data(), DType::kU8, {1, 8, 2, 64}), good, sc, OperandRole::kQ)
                .find("x: expected dtype"),
            std::string::npos);
}

}  // namespace
}  // namespace fp4attn
