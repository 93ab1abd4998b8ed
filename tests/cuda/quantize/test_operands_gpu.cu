// quantize_operand_cuda against quantize_operand_host, byte for byte (data, scale, mean), for
// every recipe and role (Q, K with and without smoothing, V), BF16 and FP16 inputs, computed and
// static NVFP4 scales, contiguous and strided inputs, adversarial values, poisoned outputs with a
// guard region, empty tensors and the GPU-only argument errors. Skips when no GPU is present.
//
// Filters: '*OperandsGpuQk.*' and '*OperandsGpuV.*' (one instance per recipe, e.g.
// 'Recipes/OperandsGpuV.*/nvfp4_all'), 'OperandsGpu.*' for empty tensors and errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/operands.h"
#include "fp4attn/operands_cuda.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

constexpr size_t kGuard = 256;  // bytes after each output that must stay untouched

// Raw device bytes with a guard region; poison() fills all of it.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) : n_(n) { ok_ = cudaMalloc(&ptr_, n + kGuard) == cudaSuccess; }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return ptr_; }
  bool ok() const { return ok_; }
  bool poison(uint8_t v) { return cudaMemset(ptr_, v, n_ + kGuard) == cudaSuccess; }
  bool upload(const void* src, size_t n) {
    return cudaMemcpy(ptr_, src, n, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(n_ + kGuard);
    if (cudaMemcpy(v.data(), ptr_, v.size(), cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
  bool ok_ = false;
};

enum class Layout { kBshd, kBhsd, kPadded };
enum class Pattern { kGaussian, kTies, kSubnormal, kSpecial, kExtremes, kRandomBits };

const char* layout_name(Layout l) {
  return l == Layout::kBshd ? "bshd" : l == Layout::kBhsd ? "bhsd-permuted" : "padded";
}
const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kGaussian:
      return "gaussian";
    case Pattern::kTies:
      return "ties";
    case Pattern::kSubnormal:
      return "subnormal";
    case Pattern::kSpecial:
      return "nan-inf-zero-head";
    case Pattern::kExtremes:
      return "extremes";
    case Pattern::kRandomBits:
      return "random-bits";
  }
  return "?";
}
const char* role_name(OperandRole r) {
  return r == OperandRole::kQ ? "Q" : r == OperandRole::kK ? "K" : "V";
}

struct Case {
  Recipe recipe = Recipe::kNvfp4;
  OperandRole role = OperandRole::kQ;
  bool smooth = false;
  DType dtype = DType::kBF16;
  int64_t b = 1, s = 1, h = 1, d = 64;
  float tensor_scale = 0.f;
  Layout layout = Layout::kBshd;
  Pattern pattern = Pattern::kGaussian;

  std::string str() const {
    std::ostringstream o;
    o << recipe_name(recipe) << " " << role_name(role) << (smooth ? "+smooth" : "") << " "
      << dtype_name(dtype) << " [" << b << ", " << s << ", " << h << ", " << d
      << "] tensor_scale=" << tensor_scale << " " << layout_name(layout) << " "
      << pattern_name(pattern);
    return o.str();
  }
};

// The input: storage (with gaps for the padded layout, filled with NaN bits so that a read of a
// gap shows) and the strides of the BSHD view over it.
struct Input {
  std::vector<uint16_t> storage;
  int64_t stride[4];
};

uint16_t to_bits(float v, DType t) {
  return t == DType::kBF16 ? float_to_bf16_bits(v) : float_to_f16_bits(v);
}

Input make_input(const Case& c, uint32_t seed) {
  const int64_t b = c.b, s = c.s, h = c.h, d = c.d;
  Input in;
  int64_t size = b * s * h * d;
  switch (c.layout) {
    case Layout::kBshd:
      in.stride[0] = s * h * d, in.stride[1] = h * d, in.stride[2] = d;
      break;
    case Layout::kBhsd:  // storage [b, h, s, d], viewed as BSHD
      in.stride[0] = h * s * d, in.stride[1] = d, in.stride[2] = s * d;
      break;
    case Layout::kPadded:  // BSHD with a head pitch of d + 8 and gaps between tokens and batches
      in.stride[2] = d + 8, in.stride[1] = h * (d + 8) + 16, in.stride[0] = s * in.stride[1] + 24;
      size = b * in.stride[0];
      break;
  }
  in.stride[3] = 1;
  const uint16_t gap = c.dtype == DType::kBF16 ? 0x7FC1 : 0x7E01;
  in.storage.assign(size, gap);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> uni(0, 1 << 30);
  const bool bf16 = c.dtype == DType::kBF16;
  // Per-(b, h) magnitudes so that computed scales differ between slices.
  auto head_scale = [&](int64_t hi) { return std::ldexp(1.f, static_cast<int>(hi % 5) * 3 - 4); };
  static const float kTieValues[] = {0.f,  0.25f, 0.75f, 1.25f, 1.75f, 2.5f,
                                     3.5f, 5.f,   6.f,   0.5f,  3.f,   4.f};
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t hi = 0; hi < h; ++hi) {
        for (int64_t ch = 0; ch < d; ++ch) {
          const int64_t off = bi * in.stride[0] + t * in.stride[1] + hi * in.stride[2] + ch;
          uint16_t bits = 0;
          switch (c.pattern) {
            case Pattern::kGaussian:
              bits = to_bits(normal(rng) * head_scale(hi + bi), c.dtype);
              break;
            case Pattern::kTies: {
              // Midpoints of E2M1 with a 6 in every 16-block: with s_enc from amax 6 the inverse
              // block scale is exactly 1, so the ties survive to the E2M1 rounding.
              float v = ch % 16 == (t + hi) % 16 ? 6.f : kTieValues[uni(rng) % 12];
              if (uni(rng) & 1) v = -v;
              bits = to_bits(v, c.dtype);
              break;
            }
            case Pattern::kSubnormal: {
              // Subnormal halves (exponent field 0) mixed with small normals.
              const uint32_t r = static_cast<uint32_t>(uni(rng));
              if (bf16) {
                bits = (r & 3) ? static_cast<uint16_t>(r & 0x807Fu)               // subnormal
                               : static_cast<uint16_t>((r & 0x807Fu) | 0x0080u);  // min normal
              } else {
                bits = (r & 3) ? static_cast<uint16_t>(r & 0x83FFu)
                               : static_cast<uint16_t>((r & 0x83FFu) | 0x0400u);
              }
              break;
            }
            case Pattern::kSpecial: {
              float v = normal(rng) * head_scale(hi);
              if (hi == 1 % h) v = 0.f;                                   // an all-zero head
              if (hi == 0 && t == s / 2 && ch >= 16 && ch < 32) v = NAN;  // NaN in one block
              if (hi == h - 1 && t == 0 && ch < 4) v = INFINITY;          // Inf in another
              if (ch == d - 1 && (t & 1)) v = -0.f;
              bits = to_bits(v, c.dtype);
              break;
            }
            case Pattern::kExtremes: {
              // Huge and tiny magnitudes: a random binade per (token, block of 16).
              std::mt19937 brng(static_cast<uint32_t>(seed ^ (t * 131 + hi * 7 + ch / 16)));
              const int lo = bf16 ? -130 : -24, hi_e = bf16 ? 126 : 15;
              const int e = lo + static_cast<int>(brng() % static_cast<uint32_t>(hi_e - lo + 1));
              bits = to_bits(std::ldexp(normal(rng), e), c.dtype);
              break;
            }
            case Pattern::kRandomBits:
              bits = static_cast<uint16_t>(uni(rng));
              break;
          }
          in.storage[off] = bits;
        }
      }
    }
  }
  return in;
}

struct Outputs {
  std::vector<uint8_t> data, scale, mean;
};

int64_t data_bytes(const Case& c) {
  const int64_t n =
      c.role == OperandRole::kV ? c.b * c.h * c.d * operand_v_pitch(c.s) : c.b * c.h * c.s * c.d;
  return n * (c.recipe == Recipe::kBf16 ? 2 : 1);
}
int64_t scale_count(const Case& c) {
  return c.b * c.h * (c.role == OperandRole::kV ? c.d : operand_scale_tiles(c.s));
}

// The output views of a case over the given pointers.
void output_views(const Case& c, void* data, void* scale, void* mean, TensorView* dv,
                  TensorView* sv, TensorView* mv) {
  const DType code = operand_data_dtype(c.recipe, c.role);
  if (c.role == OperandRole::kV) {
    *dv = make_view(data, code, {c.b, c.h, c.d, operand_v_pitch(c.s)});
    *sv = make_view(scale, DType::kF32, {c.b, c.h, c.d});
  } else {
    *dv = make_view(data, code, {c.b, c.h, c.s, c.d});
    *sv = make_view(scale, DType::kF32, {c.b, c.h, operand_scale_tiles(c.s)});
  }
  *mv = c.smooth ? make_view(mean, DType::kF32, {c.b, c.h, c.d}) : TensorView{};
}

TensorView input_view(const Case& c, void* p, const Input& in) {
  return make_strided_view(p, c.dtype, {c.b, c.s, c.h, c.d},
                           {in.stride[0], in.stride[1], in.stride[2], in.stride[3]});
}

OperandOptions options(const Case& c) {
  OperandOptions opt;
  opt.tensor_scale = c.tensor_scale;
  opt.smooth_k = c.smooth;
  return opt;
}

// Compares the first want.size() bytes and checks that the guard after them is still `poison`.
::testing::AssertionResult same_bytes(const char* what, const std::vector<uint8_t>& want,
                                      const std::vector<uint8_t>& got, uint8_t poison,
                                      int elem_size) {
  if (got.size() != want.size() + kGuard) {
    return ::testing::AssertionFailure() << what << ": download failed";
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (got[i] != poison) {
      return ::testing::AssertionFailure()
             << what << ": guard byte " << (i - want.size()) << " after the output was written";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const int64_t e = first / elem_size * elem_size;
  std::ostringstream o;
  o << what << ": " << bad << " of " << want.size() << " bytes differ; first at element "
    << e / elem_size << ": want";
  for (int k = elem_size - 1; k >= 0; --k) o << " " << std::hex << int(want[e + k]);
  o << ", got";
  for (int k = elem_size - 1; k >= 0; --k) o << " " << std::hex << int(got[e + k]);
  o << " (poison 0x" << int(poison) << ")";
  return ::testing::AssertionFailure() << o.str();
}

// Runs the host reference and the GPU (twice, with different output poison) and compares.
void check_case(Case c, uint32_t seed) {
  // The int8 recipes' K is smoothed whatever the options say: both sides then write a mean.
  c.smooth = c.smooth || (c.role == OperandRole::kK && recipe_smooths_k(c.recipe));
  SCOPED_TRACE(c.str());
  const Input in = make_input(c, seed);
  // Host reference (outputs pre-filled with another poison: a byte neither side writes shows).
  Outputs want;
  want.data.assign(data_bytes(c), 0xCD);
  want.scale.assign(scale_count(c) * 4, 0xCD);
  want.mean.assign(c.smooth ? c.b * c.h * c.d * 4 : 0, 0xCD);
  {
    TensorView dv, sv, mv;
    output_views(c, want.data.data(), want.scale.data(), want.mean.data(), &dv, &sv, &mv);
    std::vector<uint16_t> host_in = in.storage;
    const Status st = quantize_operand_host(input_view(c, host_in.data(), in), c.recipe, c.role,
                                            options(c), dv, sv, mv);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  DeviceBytes x(in.storage.size() * 2), data(want.data.size()), scale(want.scale.size()),
      mean(want.mean.size());
  ASSERT_TRUE(x.ok() && data.ok() && scale.ok() && mean.ok());
  ASSERT_TRUE(x.upload(in.storage.data(), in.storage.size() * 2));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (uint8_t poison : {uint8_t{0xAB}, uint8_t{0x54}}) {
    ASSERT_TRUE(data.poison(poison) && scale.poison(poison) && mean.poison(poison));
    TensorView dv, sv, mv;
    output_views(c, data.get(), scale.get(), mean.get(), &dv, &sv, &mv);
    const Status st = quantize_operand_cuda(input_view(c, x.get(), in), c.recipe, c.role,
                                            options(c), dv, sv, mv, stream);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_TRUE(
        same_bytes("data", want.data, data.download(), poison, c.recipe == Recipe::kBf16 ? 2 : 1));
    EXPECT_TRUE(same_bytes("scale", want.scale, scale.download(), poison, 4));
    EXPECT_TRUE(same_bytes("mean", want.mean, mean.download(), poison, 4));
    if (::testing::Test::HasFailure()) break;
  }
  cudaStreamDestroy(stream);
}

bool is_nvfp4_scaled(Recipe r, OperandRole role) {
  if (role == OperandRole::kV) return r == Recipe::kNvfp4All;
  Nvfp4ScaleRule rule;
  return operand_nvfp4_rule(r, role, &rule);
}

struct Shape {
  int64_t b, s;
};
constexpr Shape kShapes[] = {{1, 1}, {2, 7}, {1, 127}, {2, 128}, {1, 129}, {1, 1000}};

// Every shape x dtype x head_dim x scale mode for the given roles; layouts rotate.
void sweep(Recipe recipe, std::initializer_list<std::pair<OperandRole, bool>> roles) {
  uint32_t seed = 1;
  int layout = 0;
  for (auto [role, smooth] : roles) {
    const int64_t h = role == OperandRole::kQ ? 4 : 2;
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (int64_t d : {64, 128}) {
        for (const Shape& sh : kShapes) {
          for (float ts : {0.f, 517.25f}) {
            if (ts != 0.f && !is_nvfp4_scaled(recipe, role)) continue;
            Case c;
            c.recipe = recipe, c.role = role, c.smooth = smooth, c.dtype = dtype;
            c.b = sh.b, c.s = sh.s, c.h = h, c.d = d, c.tensor_scale = ts;
            c.layout = static_cast<Layout>(layout++ % 3);
            check_case(c, seed++);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Adversarial patterns, both dtypes, both head_dims, both scale modes.
void adversarial(Recipe recipe, std::initializer_list<std::pair<OperandRole, bool>> roles) {
  uint32_t seed = 1000;
  for (Pattern p : {Pattern::kTies, Pattern::kSubnormal, Pattern::kSpecial, Pattern::kExtremes,
                    Pattern::kRandomBits}) {
    for (auto [role, smooth] : roles) {
      // Random bits put NaNs of several payloads into one channel; which one x86 propagates
      // through the K mean's sum depends on the host compiler's operand order.
      const bool smoothed = smooth || (role == OperandRole::kK && recipe_smooths_k(recipe));
      if (p == Pattern::kRandomBits && smoothed) continue;
      for (DType dtype : {DType::kBF16, DType::kF16}) {
        for (int64_t d : {64, 128}) {
          for (float ts : {0.f, 8.f}) {
            if (ts != 0.f && !is_nvfp4_scaled(recipe, role)) continue;
            Case c;
            c.recipe = recipe, c.role = role, c.smooth = smooth, c.dtype = dtype;
            c.b = 2, c.s = 133, c.h = 3, c.d = d, c.tensor_scale = ts;
            c.layout = d == 64 ? Layout::kBhsd : Layout::kBshd;
            c.pattern = p;
            check_case(c, seed++);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

std::string recipe_param_name(const ::testing::TestParamInfo<Recipe>& info) {
  std::string n = recipe_name(info.param);
  for (char& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n;
}

// ---- Q and K ------------------------------------------------------------------------------------

class OperandsGpuQk : public ::testing::TestWithParam<Recipe> {};

TEST_P(OperandsGpuQk, MatchesHostOverShapesDtypesScalesLayouts) {
  SKIP_WITHOUT_GPU();
  sweep(GetParam(), {{OperandRole::kQ, false}, {OperandRole::kK, false}, {OperandRole::kK, true}});
}

TEST_P(OperandsGpuQk, MatchesHostOnAdversarialInputs) {
  SKIP_WITHOUT_GPU();
  adversarial(GetParam(),
              {{OperandRole::kQ, false}, {OperandRole::kK, false}, {OperandRole::kK, true}});
}

TEST_P(OperandsGpuQk, ManyHeadsAndTiles) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.recipe = GetParam(), c.role = OperandRole::kK, c.smooth = true;
  c.b = 3, c.s = 2047, c.h = 5, c.d = 128, c.layout = Layout::kPadded;
  check_case(c, 77);
}

INSTANTIATE_TEST_SUITE_P(Recipes, OperandsGpuQk, ::testing::ValuesIn(kAllRecipes),
                         recipe_param_name);

// ---- V
// --------------------------------------------------------------------------------------------

class OperandsGpuV : public ::testing::TestWithParam<Recipe> {};

TEST_P(OperandsGpuV, MatchesHostOverShapesDtypesScalesLayouts) {
  SKIP_WITHOUT_GPU();
  sweep(GetParam(), {{OperandRole::kV, false}});
}

TEST_P(OperandsGpuV, MatchesHostOnAdversarialInputs) {
  SKIP_WITHOUT_GPU();
  adversarial(GetParam(), {{OperandRole::kV, false}});
}

TEST_P(OperandsGpuV, ManyHeadsAndTokens) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.recipe = GetParam(), c.role = OperandRole::kV;
  c.b = 3, c.s = 2047, c.h = 5, c.d = 128, c.layout = Layout::kPadded;
  check_case(c, 78);
}

INSTANTIATE_TEST_SUITE_P(Recipes, OperandsGpuV, ::testing::ValuesIn(kAllRecipes),
                         recipe_param_name);

// ---- empty tensors and errors -----------------------------------------------------------------

TEST(OperandsGpu, EmptyTensorsQk) {
  SKIP_WITHOUT_GPU();
  for (Recipe r : kAllRecipes) {
    for (bool smooth : {false, true}) {
      Case c;
      c.recipe = r, c.role = OperandRole::kK, c.smooth = smooth, c.h = 2, c.d = 64;
      for (Shape sh : {Shape{0, 5}, Shape{2, 0}}) {
        c.b = sh.b, c.s = sh.s;
        check_case(c, 5);  // s == 0 with smoothing: the mean is 0, as the host writes
      }
      c.b = 2, c.s = 5, c.h = 0;
      check_case(c, 6);
    }
  }
}

TEST(OperandsGpu, EmptyTensorsV) {
  SKIP_WITHOUT_GPU();
  for (Recipe r : kAllRecipes) {
    Case c;
    c.recipe = r, c.role = OperandRole::kV, c.h = 2, c.d = 64;
    for (Shape sh : {Shape{0, 5}, Shape{2, 0}}) {
      c.b = sh.b, c.s = sh.s;
      check_case(c, 7);  // s == 0: no data, channel scales as the host writes them
    }
  }
}

// A status's message must contain `part`.
::testing::AssertionResult fails_with(const Status& st, const std::string& part) {
  if (st.ok()) return ::testing::AssertionFailure() << "expected an error containing: " << part;
  if (st.message().find(part) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message \"" << st.message() << "\" lacks \"" << part << "\"";
  }
  return ::testing::AssertionSuccess();
}

TEST(OperandsGpu, RejectsMisalignedPointersBadStridesAndFp32) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 1, s = 16, h = 2, d = 64;
  DeviceBytes x(b * s * h * d * 4 + 64), data(b * h * s * d + 64), scale(b * h * d * 4);
  ASSERT_TRUE(x.ok() && data.ok() && scale.ok());
  for (OperandRole role : {OperandRole::kQ, OperandRole::kK, OperandRole::kV}) {
    SCOPED_TRACE(role_name(role));
    const bool v = role == OperandRole::kV;
    TensorView dv = v ? make_view(data.get(), DType::kE4M3, {b, h, d, operand_v_pitch(s)})
                      : make_view(data.get(), DType::kE4M3, {b, h, s, d});
    TensorView sv = v ? make_view(scale.get(), DType::kF32, {b, h, d})
                      : make_view(scale.get(), DType::kF32, {b, h, operand_scale_tiles(s)});
    auto run = [&](const TensorView& xv) {
      return quantize_operand_cuda(xv, Recipe::kNvfp4, role, {}, dv, sv, TensorView{}, nullptr);
    };
    char* base = static_cast<char*>(x.get());
    // The sanity case works.
    EXPECT_TRUE(run(make_view(base, DType::kBF16, {b, s, h, d})).ok());
    // x one element (2 bytes) past a 16-byte boundary.
    EXPECT_TRUE(fails_with(run(make_view(base + 2, DType::kBF16, {b, s, h, d})),
                           "x: data pointer must be 16-byte aligned"));
    // A token stride that is not a multiple of 8 elements.
    EXPECT_TRUE(fails_with(
        run(make_strided_view(base, DType::kBF16, {b, s, h, d},
                              {s * (h * d + 4), h * d + 4, d, 1})),
        "x: stride of dimension 1 must be a multiple of 8 elements (16 bytes), got 132"));
    // A head stride that is not.
    EXPECT_TRUE(fails_with(
        run(make_strided_view(base, DType::kF16, {b, s, h, d}, {s * h * 72, h * 72, 68, 1})),
        "x: stride of dimension 2 must be a multiple of 8 elements"));
    // FP32 input: the GPU reads 16-bit inputs only.
    EXPECT_TRUE(fails_with(run(make_view(base, DType::kF32, {b, s, h, d})),
                           "x: expected dtype bfloat16, float16, got float32"));
  }
  // Q/K data stored in 16-byte vectors.
  TensorView x16 = make_view(x.get(), DType::kBF16, {b, s, h, d});
  TensorView dv = make_view(static_cast<char*>(data.get()) + 1, DType::kE4M3, {b, h, s, d});
  TensorView sv = make_view(scale.get(), DType::kF32, {b, h, operand_scale_tiles(s)});
  EXPECT_TRUE(fails_with(
      quantize_operand_cuda(x16, Recipe::kFp8, OperandRole::kQ, {}, dv, sv, TensorView{}, nullptr),
      "data: data pointer must be 16-byte aligned"));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace fp4attn
