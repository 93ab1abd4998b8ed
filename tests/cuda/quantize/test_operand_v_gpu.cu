// V kernel operand on the GPU (quantize_operand_cuda, OperandRole::kV) against the host
// reference quantize_operand_host, byte for byte: every recipe, BF16 and FP16 inputs, head_dim
// 64 and 128, sequence lengths around the 16/32-token blocks and the kernel tiles, strided
// inputs, NaN/Inf in a channel, all-zero slices, wide dynamic ranges, static and computed NVFP4
// s_enc, and outputs poisoned beforehand (padding included). Skips when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/operands.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/recipe.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

constexpr uint8_t kPoison = 0xCD;

// A V input [b, s, h, d] of 16-bit codes in a buffer with the given element strides.
struct VInput {
  int64_t b = 0, s = 0, h = 0, d = 0;
  int64_t stride[4] = {0, 0, 0, 1};
  DType dtype = DType::kBF16;
  std::vector<uint16_t> bits;

  int64_t offset(int64_t bi, int64_t si, int64_t hi, int64_t c) const {
    return bi * stride[0] + si * stride[1] + hi * stride[2] + c;
  }
  void set(int64_t bi, int64_t si, int64_t hi, int64_t c, float v) {
    bits[offset(bi, si, hi, c)] =
        dtype == DType::kBF16 ? float_to_bf16_bits(v) : float_to_f16_bits(v);
  }
  void set_bits(int64_t bi, int64_t si, int64_t hi, int64_t c, uint16_t v) {
    bits[offset(bi, si, hi, c)] = v;
  }
  TensorView view(void* ptr) const {
    return make_strided_view(ptr, dtype, {b, s, h, d}, {stride[0], stride[1], stride[2], 1});
  }
};

// Gaussian values with a channel-dependent magnitude (2^-6 .. 2^6) and a few outliers; strided
// layouts pad every dimension (strides stay multiples of 8 elements).
VInput make_input(int64_t b, int64_t s, int64_t h, int64_t d, DType dtype, bool strided,
                  uint32_t seed) {
  VInput in;
  in.b = b, in.s = s, in.h = h, in.d = d, in.dtype = dtype;
  in.stride[2] = strided ? d + 8 : d;
  in.stride[1] = h * in.stride[2] + (strided ? 16 : 0);
  in.stride[0] = s * in.stride[1] + (strided ? 24 : 0);
  in.bits.assign(static_cast<size_t>(b * in.stride[0] + 64), 0x7FFF);  // gaps: NaN bits
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> pct(0, 999);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t si = 0; si < s; ++si) {
      for (int64_t hi = 0; hi < h; ++hi) {
        for (int64_t c = 0; c < d; ++c) {
          float v = std::ldexp(normal(rng), static_cast<int>((c * 7 + hi) % 13) - 6);
          if (pct(rng) == 0) v *= 50.f;
          in.set(bi, si, hi, c, v);
        }
      }
    }
  }
  return in;
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (n > 0) EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::string case_name(Recipe r, const VInput& in, const OperandOptions& opt) {
  return std::string(recipe_name(r)) + " " + dtype_name(in.dtype) + " b=" + std::to_string(in.b) +
         " s=" + std::to_string(in.s) + " h=" + std::to_string(in.h) +
         " d=" + std::to_string(in.d) + " tensor_scale=" + std::to_string(opt.tensor_scale);
}

// Runs host and GPU on `in` and expects identical data bytes (padding included) and identical
// scale bits.
void expect_same_as_host(const VInput& in, Recipe recipe, const OperandOptions& opt = {}) {
  const std::string name = case_name(recipe, in, opt);
  const int64_t pitch = operand_v_pitch(in.s);
  const DType code_type = recipe == Recipe::kBf16 ? DType::kBF16 : DType::kE4M3;
  const size_t elem = recipe == Recipe::kBf16 ? 2 : 1;
  const int64_t n_data = in.b * in.h * in.d * pitch, n_scale = in.b * in.h * in.d;

  // Host reference.
  std::vector<uint8_t> ref_data(n_data * elem, kPoison);
  std::vector<float> ref_scale(n_scale, -7.f);
  std::vector<uint16_t> x_host = in.bits;
  const Status hs = quantize_operand_host(
      in.view(x_host.data()), recipe, OperandRole::kV, opt,
      make_view(ref_data.data(), code_type, {in.b, in.h, in.d, pitch}),
      make_view(ref_scale.data(), DType::kF32, {in.b, in.h, in.d}), TensorView{});
  ASSERT_TRUE(hs.ok()) << name << ": " << hs.message();

  // GPU, outputs poisoned.
  DeviceBuffer<uint16_t> x_dev(in.bits.size());
  DeviceBuffer<uint8_t> data_dev(n_data * elem);
  DeviceBuffer<float> scale_dev(n_scale);
  ASSERT_EQ(cudaMemcpy(x_dev.ptr, in.bits.data(), in.bits.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  if (n_data > 0) ASSERT_EQ(cudaMemset(data_dev.ptr, kPoison, n_data * elem), cudaSuccess);
  ASSERT_EQ(cudaMemset(scale_dev.ptr, 0xFF, n_scale * 4), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Status gs = quantize_operand_cuda(
      in.view(x_dev.ptr), recipe, OperandRole::kV, opt,
      make_view(data_dev.ptr, code_type, {in.b, in.h, in.d, pitch}),
      make_view(scale_dev.ptr, DType::kF32, {in.b, in.h, in.d}), TensorView{}, stream);
  ASSERT_TRUE(gs.ok()) << name << ": " << gs.message();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << name;
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);

  std::vector<uint8_t> got_data(n_data * elem);
  std::vector<float> got_scale(n_scale);
  if (n_data > 0) {
    ASSERT_EQ(cudaMemcpy(got_data.data(), data_dev.ptr, n_data * elem, cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  ASSERT_EQ(cudaMemcpy(got_scale.data(), scale_dev.ptr, n_scale * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);

  int reported = 0;
  for (int64_t i = 0; i < n_data && reported < 8; ++i) {
    if (std::memcmp(&got_data[i * elem], &ref_data[i * elem], elem) != 0) {
      const int64_t t = i % pitch, c = (i / pitch) % in.d, bh = i / pitch / in.d;
      uint32_t g = 0, r = 0;
      std::memcpy(&g, &got_data[i * elem], elem);
      std::memcpy(&r, &ref_data[i * elem], elem);
      ADD_FAILURE() << name << ": data differs at slice " << bh << " channel " << c << " token "
                    << t << ": gpu 0x" << std::hex << g << " host 0x" << r << std::dec;
      ++reported;
    }
  }
  for (int64_t i = 0; i < n_scale && reported < 16; ++i) {
    if (std::memcmp(&got_scale[i], &ref_scale[i], 4) != 0) {
      ADD_FAILURE() << name << ": scale differs at slice " << i / in.d << " channel " << i % in.d
                    << ": gpu " << got_scale[i] << " host " << ref_scale[i];
      ++reported;
    }
  }
}

struct VCase {
  Recipe recipe;
  DType dtype;
  int64_t d;
};

class OperandVGpu : public ::testing::TestWithParam<VCase> {};

TEST_P(OperandVGpu, MatchesHostAcrossLengths) {
  SKIP_WITHOUT_GPU();
  const VCase c = GetParam();
  uint32_t seed = 1;
  for (int64_t s : {1, 15, 16, 17, 129, 1000}) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE("s=" + std::to_string(s) + (strided ? " strided" : " contiguous"));
      const VInput in = make_input(2, s, 3, c.d, c.dtype, strided, seed++);
      expect_same_as_host(in, c.recipe);
    }
  }
}

// NaN and Inf in single channels, an all-zero slice (with -0 values), an all-(-0) channel.
TEST_P(OperandVGpu, SpecialValues) {
  SKIP_WITHOUT_GPU();
  const VCase c = GetParam();
  const bool f16 = c.dtype == DType::kF16;
  for (int64_t s : {17, 129, 300}) {
    SCOPED_TRACE("s=" + std::to_string(s));
    VInput in = make_input(2, s, 3, c.d, c.dtype, true, 100 + static_cast<uint32_t>(s));
    // Slice (0, 1): NaN in channel 5 (token 7), -Inf in channel 9 (last token), a signalling /
    // negative NaN payload in channel 11.
    in.set_bits(0, 7, 1, 5, f16 ? 0x7E00 : 0x7FC0);
    in.set(0, s - 1, 1, 9, -std::numeric_limits<float>::infinity());
    in.set_bits(0, 3, 1, 11, f16 ? 0xFC01 : 0xFF81);
    // Slice (1, 2): all zeros, some negative.
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t ch = 0; ch < c.d; ++ch) in.set(1, t, 2, ch, (t + ch) % 3 == 0 ? -0.f : 0.f);
    }
    // Slice (1, 0): channel 2 all -0; channel 3 tiny (subnormal in FP16), channel 4 huge.
    for (int64_t t = 0; t < s; ++t) {
      in.set(1, t, 0, 2, -0.f);
      in.set(1, t, 0, 3, (t % 2 ? -1.f : 1.f) * (f16 ? 3e-7f : 1e-30f) * (1 + t % 5));
      in.set(1, t, 0, 4, (t % 3 ? 1.f : -1.f) * (f16 ? 6e4f : 1e30f));
    }
    expect_same_as_host(in, c.recipe);
  }
}

// Every 32-token block of a slice holds a NaN (fp4-direct: no finite block, t = 0), and a slice
// whose blocks span the full exponent range.
TEST_P(OperandVGpu, AllBlocksNaNAndWideRange) {
  SKIP_WITHOUT_GPU();
  const VCase c = GetParam();
  const bool f16 = c.dtype == DType::kF16;
  const int64_t s = 70;
  VInput in = make_input(2, s, 3, c.d, c.dtype, false, 77);
  for (int64_t ch = 0; ch < c.d; ++ch) {
    for (int64_t t = 0; t < s; t += 32) in.set_bits(1, t + ch % 5, 1, ch, f16 ? 0x7C01 : 0x7F81);
  }
  for (int64_t t = 0; t < s; ++t) {
    for (int64_t ch = 0; ch < c.d; ++ch) {
      const int e = f16 ? static_cast<int>((ch + t / 16) % 40) - 24
                        : static_cast<int>((ch * 5 + t / 32 * 3) % 250) - 125;
      in.set(0, t, 2, ch, std::ldexp((t % 2 ? -1.f : 1.f) * (1.f + (t % 7) / 8.f), e));
    }
  }
  expect_same_as_host(in, c.recipe);
}

TEST_P(OperandVGpu, EmptySequenceWritesScales) {
  SKIP_WITHOUT_GPU();
  const VCase c = GetParam();
  VInput in = make_input(2, 0, 3, c.d, c.dtype, false, 5);
  expect_same_as_host(in, c.recipe);
  OperandOptions opt;
  opt.tensor_scale = 3.25f;
  expect_same_as_host(in, c.recipe, opt);
}

// nvfp4-all with a static s_enc (a typical one, one that makes tiny blocks' scales 0 and one
// that saturates) against the computed one.
TEST_P(OperandVGpu, StaticTensorScale) {
  SKIP_WITHOUT_GPU();
  const VCase c = GetParam();
  for (float ts : {0.f, 37.5f, 1e-3f, 1e6f}) {
    OperandOptions opt;
    opt.tensor_scale = ts;
    SCOPED_TRACE("tensor_scale=" + std::to_string(ts));
    expect_same_as_host(make_input(2, 129, 3, c.d, c.dtype, true, 9), c.recipe, opt);
  }
}

std::vector<VCase> all_cases() {
  std::vector<VCase> v;
  for (Recipe r : kAllRecipes) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      for (int64_t d : {64, 128}) v.push_back({r, t, d});
    }
  }
  return v;
}

std::string case_label(const ::testing::TestParamInfo<VCase>& info) {
  std::string n = std::string(recipe_name(info.param.recipe)) + "_" +
                  (info.param.dtype == DType::kBF16 ? "bf16in" : "f16in") + "_d" +
                  std::to_string(info.param.d);
  for (char& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, OperandVGpu, ::testing::ValuesIn(all_cases()), case_label);

// A long sequence over several kernel tiles and pre-pass chunks (> 4096 / 8192 tokens).
TEST(OperandVGpuLarge, LongSequence) {
  SKIP_WITHOUT_GPU();
  for (Recipe r : {Recipe::kFp8, Recipe::kNvfp4All, Recipe::kFp4Direct, Recipe::kBf16}) {
    for (int64_t d : {64, 128}) {
      expect_same_as_host(make_input(1, 9000, 2, d, DType::kBF16, true, 3), r);
    }
  }
}

// Misaligned V^T output: rejected, nothing written.
TEST(OperandVGpuLarge, MisalignedDataIsRejected) {
  SKIP_WITHOUT_GPU();
  const VInput in = make_input(1, 16, 1, 64, DType::kBF16, false, 1);
  DeviceBuffer<uint16_t> x_dev(in.bits.size());
  DeviceBuffer<uint8_t> data_dev(64 * 16 + 16);
  DeviceBuffer<float> scale_dev(64);
  const Status st = quantize_operand_cuda(in.view(x_dev.ptr), Recipe::kFp8, OperandRole::kV, {},
                                          make_view(data_dev.ptr + 4, DType::kE4M3, {1, 1, 64, 16}),
                                          make_view(scale_dev.ptr, DType::kF32, {1, 1, 64}),
                                          TensorView{}, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("data"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fp4attn
