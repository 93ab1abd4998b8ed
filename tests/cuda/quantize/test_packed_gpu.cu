// GPU packed storage (quantize_cuda.h): every packed byte and every scale byte of the NVFP4 /
// MXFP4 quantizers equals the host reference (nvfp4_quantize_rows / mxfp4_quantize_rows +
// pack_e2m1_rows + scales_to_swizzled), on random and adversarial inputs, BF16 and FP16, odd
// shapes, strided inputs, both scale layouts, supplied and computed s_enc. Outputs are poisoned
// (0xAB) with guard bytes after each buffer that must stay 0xAB. Also: the tensor amax, the
// dequantizer (exact against the host decode), the repack to kernel operands (against
// quantize_operand_host) and the error texts of bad input. GPU tests skip without a device; the
// bad-input tests need none (validation happens before any CUDA call).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

using testing::kGuard;
using testing::kPoison;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

using Guarded = testing::GuardedBuffer;

struct Shape {
  int64_t b, s, h, d;
  int64_t rows() const { return b * s * h; }
  int64_t numel() const { return rows() * d; }
};

std::string str(const Shape& p) {
  std::ostringstream o;
  o << "(" << p.b << ", " << p.s << ", " << p.h << ", " << p.d << ")";
  return o.str();
}

// ---- inputs -----------------------------------------------------------------------------------

uint16_t to_bits(float v, DType dt) {
  return dt == DType::kBF16 ? float_to_bf16_bits(v) : float_to_f16_bits(v);
}
float from_bits(uint16_t b, DType dt) {
  return dt == DType::kBF16 ? bf16_bits_to_float(b) : f16_bits_to_float(b);
}

enum class Input { kRandom, kAdversarial, kTiny, kHuge };

// Bits of numel 16-bit values. Adversarial blocks of 16 cycle through: the E2M1 tie points
// {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} at amax 6 (scale 1 for s_enc 1 and MX), the same +-1 ulp,
// subnormals (alone and next to normals), saturating maxima, NaN/Inf in a block, all-zero and
// -0 blocks, huge and tiny magnitudes.
std::vector<uint16_t> make_input(int64_t numel, DType dt, Input kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> exp_dist(-20, 20);
  std::vector<uint16_t> out(numel);
  const bool bf = dt == DType::kBF16;
  const uint16_t max_finite = bf ? 0x7F7F : 0x7BFF, inf = bf ? 0x7F80 : 0x7C00,
                 nan = bf ? 0x7FC0 : 0x7E00, sub_max = bf ? 0x007F : 0x03FF;
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  for (int64_t blk = 0; blk * 16 < numel; ++blk) {
    const int64_t base = blk * 16;
    const int n = static_cast<int>(std::min<int64_t>(16, numel - base));
    const int pattern = kind == Input::kAdversarial ? static_cast<int>(rng() % 12) : -1;
    const float block_scale = std::ldexp(1.f, exp_dist(rng));
    for (int i = 0; i < n; ++i) {
      uint16_t v = 0;
      switch (pattern) {
        case 0:    // exact ties, amax 6
        case 1: {  // ties +- 1 ulp
          if (i == 0) {
            v = to_bits(6.f, dt);
          } else {
            v = to_bits((i % 2 ? -1.f : 1.f) * ties[i % 7], dt);
            if (pattern == 1) v = static_cast<uint16_t>(v + (rng() % 2 ? 1 : -1));
          }
          break;
        }
        case 2:  // subnormals only
          v = static_cast<uint16_t>((rng() % sub_max) | (rng() % 2 ? 0x8000 : 0));
          break;
        case 3:  // subnormals next to a normal
          v = i == 3 ? to_bits(0.01f, dt) : static_cast<uint16_t>(rng() % (sub_max + 1));
          break;
        case 4:  // saturation: the largest finite values
          v = static_cast<uint16_t>((i % 3 == 0 ? max_finite : max_finite - rng() % 64) |
                                    (i % 2 ? 0x8000 : 0));
          break;
        case 5:  // a NaN in the block
          v = i == 5 ? nan : to_bits(normal(rng), dt);
          break;
        case 6:  // an Inf in the block
          v = i == 9 ? static_cast<uint16_t>(inf | (rng() % 2 ? 0x8000 : 0))
                     : to_bits(normal(rng), dt);
          break;
        case 7:  // all zero
          v = 0;
          break;
        case 8:  // -0 and +0
          v = i % 2 ? 0x8000 : 0;
          break;
        case 9:  // one value 2^k above the rest
          v = to_bits(i == 0 ? 1000.f : normal(rng) * 1e-3f, dt);
          break;
        case 10:  // grid of small integers (exact codes at many scales)
          v = to_bits(static_cast<float>(static_cast<int>(rng() % 13) - 6) * block_scale, dt);
          break;
        default:
          v = to_bits(normal(rng) * block_scale, dt);
          break;
      }
      if (kind == Input::kRandom) v = to_bits(normal(rng) * 3.f, dt);
      if (kind == Input::kTiny) v = to_bits(normal(rng) * (bf ? 1e-36f : 1e-5f), dt);
      if (kind == Input::kHuge) v = to_bits(normal(rng) * (bf ? 1e36f : 3e4f), dt);
      out[base + i] = v;
    }
  }
  return out;
}

// A device copy of x (logical [b, s, h, d]), contiguous or inside a padded buffer
// [b, s, h + 1, d + 8] whose padding is NaN (a read outside the view would show).
struct DeviceInput {
  std::unique_ptr<Guarded> buf;
  TensorView view;
};

DeviceInput upload(const std::vector<uint16_t>& bits, const Shape& p, DType dt, bool strided) {
  DeviceInput in;
  if (!strided) {
    in.buf = std::make_unique<Guarded>(bits);
    in.view = make_view(in.buf->get(), dt, {p.b, p.s, p.h, p.d});
    return in;
  }
  const int64_t dp = p.d + 8, hp = p.h + 1;
  std::vector<uint16_t> phys(p.b * p.s * hp * dp, dt == DType::kBF16 ? 0x7FC0 : 0x7E00);
  for (int64_t r = 0; r < p.rows(); ++r) {
    const int64_t hi = r % p.h, bs = r / p.h;
    for (int64_t c = 0; c < p.d; ++c) phys[(bs * hp + hi) * dp + c] = bits[r * p.d + c];
  }
  in.buf = std::make_unique<Guarded>(phys);
  in.view =
      make_strided_view(in.buf->get(), dt, {p.b, p.s, p.h, p.d}, {p.s * hp * dp, hp * dp, dp, 1});
  return in;
}

std::vector<float> to_float(const std::vector<uint16_t>& bits, DType dt) {
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = from_bits(bits[i], dt);
  return x;
}

// ---- host reference ---------------------------------------------------------------------------

struct Packed {
  std::vector<uint8_t> packed, scales;  // scales in the requested layout
};

Packed reference_nvfp4(const std::vector<float>& x, const Shape& p, float s_enc,
                       Nvfp4ScaleRule rule, ScaleLayout layout) {
  const int64_t sf_cols = p.d / kNvfp4Block;
  std::vector<uint8_t> codes(p.numel()), scales(p.rows() * sf_cols);
  nvfp4_quantize_rows(x.data(), p.rows(), p.d, p.d, s_enc, rule, codes.data(), scales.data());
  Packed out;
  out.packed.resize(p.numel() / 2);
  pack_e2m1_rows(codes.data(), p.rows(), p.d, out.packed.data());
  if (layout == ScaleLayout::kRowMajor) {
    out.scales = scales;
  } else {
    out.scales.resize(swizzled_scale_bytes(p.rows(), sf_cols));
    scales_to_swizzled(scales.data(), p.rows(), sf_cols, out.scales.data());
  }
  return out;
}

Packed reference_mxfp4(const std::vector<float>& x, const Shape& p, MxScaleRule rule,
                       ScaleLayout layout) {
  const int64_t sf_cols = p.d / kMxfp4Block;
  std::vector<uint8_t> codes(p.numel()), scales(p.rows() * sf_cols);
  mxfp4_quantize_rows(x.data(), p.rows(), p.d, p.d, rule, codes.data(), scales.data());
  Packed out;
  out.packed.resize(p.numel() / 2);
  pack_e2m1_rows(codes.data(), p.rows(), p.d, out.packed.data());
  if (layout == ScaleLayout::kRowMajor) {
    out.scales = scales;
  } else {
    out.scales.resize(swizzled_scale_bytes(p.rows(), sf_cols));
    scales_to_swizzled(scales.data(), p.rows(), sf_cols, out.scales.data());
  }
  return out;
}

int64_t scale_bytes(const Shape& p, int block, ScaleLayout layout) {
  return layout == ScaleLayout::kRowMajor ? p.rows() * (p.d / block)
                                          : swizzled_scale_bytes(p.rows(), p.d / block);
}

TensorView scale_view(void* ptr, const Shape& p, int block, ScaleLayout layout) {
  if (layout == ScaleLayout::kRowMajor) {
    return make_view(ptr, DType::kU8, {p.b, p.s, p.h, p.d / block});
  }
  return make_view(ptr, DType::kU8, {swizzled_scale_bytes(p.rows(), p.d / block)});
}

// Index and values of the first differing byte, for messages.
::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%lld bytes differ, first at %lld: got 0x%02x, want 0x%02x",
                static_cast<long long>(bad), static_cast<long long>(first), got[first],
                want[first]);
  return ::testing::AssertionFailure() << buf;
}

const char* layout_name(ScaleLayout l) {
  return l == ScaleLayout::kRowMajor ? "row-major" : "swizzled";
}

// NaN-propagating amax of the whole input (host).
float host_amax(const std::vector<float>& x) {
  uint32_t m = 0;
  for (float v : x) m = std::max(m, bits_of(v) & 0x7FFFFFFFu);
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

// ---- the NVFP4 / MXFP4 comparisons ------------------------------------------------------------

// Quantizes on the GPU and compares everything; s_enc 0 = computed.
void check_nvfp4(const std::vector<uint16_t>& bits, const Shape& p, DType dt, bool strided,
                 Nvfp4ScaleRule rule, float s_enc, ScaleLayout layout) {
  SCOPED_TRACE(std::string("nvfp4 ") + scale_rule_name(rule) + " " + layout_name(layout) + " " +
               dtype_name(dt) + " shape " + str(p) + (strided ? " strided" : "") + " s_enc " +
               std::to_string(s_enc));
  const std::vector<float> x = to_float(bits, dt);
  DeviceInput in = upload(bits, p, dt, strided);
  Guarded packed(p.numel() / 2), scales(scale_bytes(p, kNvfp4Block, layout)), s_out(4);
  ASSERT_TRUE(in.buf->ok() && packed.ok() && scales.ok() && s_out.ok());
  const Status st = quantize_packed_nvfp4_cuda(
      in.view, rule, s_enc, layout, make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2}),
      scale_view(scales.get(), p, kNvfp4Block, layout), make_view(s_out.get(), DType::kF32, {1}),
      nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const float want_s = s_enc == 0.f ? nvfp4_tensor_scale(host_amax(x), rule) : s_enc;
  const std::vector<uint8_t> s_bytes = s_out.payload("s_enc_out");
  ASSERT_EQ(s_bytes.size(), 4u);
  float got_s;
  std::memcpy(&got_s, s_bytes.data(), 4);
  EXPECT_EQ(bits_of(got_s), bits_of(want_s)) << got_s << " vs " << want_s;
  const Packed ref = reference_nvfp4(x, p, want_s, rule, layout);
  EXPECT_TRUE(same_bytes(packed.payload("packed"), ref.packed)) << "packed codes";
  EXPECT_TRUE(same_bytes(scales.payload("scales"), ref.scales)) << "scales";
  in.buf->payload("x");  // the input's guard too (nothing writes there)
}

void check_mxfp4(const std::vector<uint16_t>& bits, const Shape& p, DType dt, bool strided,
                 MxScaleRule rule, ScaleLayout layout) {
  SCOPED_TRACE(std::string("mxfp4 ") + scale_rule_name(rule) + " " + layout_name(layout) + " " +
               dtype_name(dt) + " shape " + str(p) + (strided ? " strided" : ""));
  const std::vector<float> x = to_float(bits, dt);
  DeviceInput in = upload(bits, p, dt, strided);
  Guarded packed(p.numel() / 2), scales(scale_bytes(p, kMxfp4Block, layout));
  ASSERT_TRUE(in.buf->ok() && packed.ok() && scales.ok());
  const Status st = quantize_packed_mxfp4_cuda(
      in.view, rule, layout, make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2}),
      scale_view(scales.get(), p, kMxfp4Block, layout), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Packed ref = reference_mxfp4(x, p, rule, layout);
  EXPECT_TRUE(same_bytes(packed.payload("packed"), ref.packed)) << "packed codes";
  EXPECT_TRUE(same_bytes(scales.payload("scales"), ref.scales)) << "scales";
}

// Shapes: rows (b*s*h) not multiples of 128, s in {1, 7, 129}, odd NVFP4 block counts (d = 16,
// 48 with odd rows), several head_dims.
const Shape kNvShapes[] = {{1, 1, 1, 16},  {1, 7, 1, 16},   {1, 7, 3, 48},  {2, 129, 3, 64},
                           {3, 1, 5, 128}, {1, 129, 1, 80}, {2, 7, 2, 256}, {1, 300, 2, 128}};
const Shape kMxShapes[] = {{1, 1, 1, 32},  {1, 7, 3, 32},   {2, 129, 3, 64},
                           {3, 1, 5, 128}, {1, 129, 1, 96}, {1, 300, 2, 128}};

constexpr Nvfp4ScaleRule kNvRules[] = {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp,
                                       Nvfp4ScaleRule::kFourOverSix, Nvfp4ScaleRule::kRestricted};
constexpr ScaleLayout kLayouts[] = {ScaleLayout::kRowMajor, ScaleLayout::kSwizzled128x4};
constexpr DType kDtypes[] = {DType::kBF16, DType::kF16};

TEST(PackedNvfp4Gpu, RandomAndAdversarialAllRulesLayoutsDtypes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (DType dt : kDtypes) {
    for (const Shape& p : kNvShapes) {
      for (Input kind : {Input::kRandom, Input::kAdversarial}) {
        const std::vector<uint16_t> bits = make_input(p.numel(), dt, kind, seed++);
        for (Nvfp4ScaleRule rule : kNvRules) {
          for (ScaleLayout layout : kLayouts) {
            check_nvfp4(bits, p, dt, /*strided=*/false, rule, 0.f, layout);
            check_nvfp4(bits, p, dt, /*strided=*/false, rule, 1.f, layout);
          }
        }
      }
    }
  }
}

TEST(PackedNvfp4Gpu, SuppliedScalesIncludingExtremes) {
  SKIP_WITHOUT_GPU();
  const Shape p{2, 33, 3, 64};
  // 1e30 and 1e-30 push block scales to saturation / zero and s_enc / scale to overflow (the
  // reference path of the kernel).
  for (float s_enc : {1.f, 448.f * 6.f / 7.f, 0.37f, 1e30f, 1e-30f, 3.0e38f}) {
    for (DType dt : kDtypes) {
      const std::vector<uint16_t> bits = make_input(p.numel(), dt, Input::kAdversarial, 77);
      for (Nvfp4ScaleRule rule : kNvRules) {
        check_nvfp4(bits, p, dt, false, rule, s_enc, ScaleLayout::kRowMajor);
      }
    }
  }
}

TEST(PackedNvfp4Gpu, TinyAndHugeTensors) {
  SKIP_WITHOUT_GPU();
  const Shape p{1, 129, 2, 64};
  for (DType dt : kDtypes) {
    for (Input kind : {Input::kTiny, Input::kHuge}) {
      const std::vector<uint16_t> bits = make_input(p.numel(), dt, kind, 5);
      for (Nvfp4ScaleRule rule : kNvRules) {
        check_nvfp4(bits, p, dt, false, rule, 0.f, ScaleLayout::kSwizzled128x4);
      }
    }
  }
}

TEST(PackedNvfp4Gpu, StridedInput) {
  SKIP_WITHOUT_GPU();
  for (const Shape& p : {Shape{2, 7, 3, 16}, Shape{2, 129, 3, 48}, Shape{1, 5, 4, 128}}) {
    for (DType dt : kDtypes) {
      const std::vector<uint16_t> bits = make_input(p.numel(), dt, Input::kAdversarial, 9);
      for (Nvfp4ScaleRule rule : {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kFourOverSix}) {
        for (ScaleLayout layout : kLayouts) check_nvfp4(bits, p, dt, true, rule, 0.f, layout);
      }
    }
  }
}

TEST(PackedMxfp4Gpu, RandomAndAdversarialAllRulesLayoutsDtypes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (DType dt : kDtypes) {
    for (const Shape& p : kMxShapes) {
      for (Input kind : {Input::kRandom, Input::kAdversarial, Input::kTiny, Input::kHuge}) {
        const std::vector<uint16_t> bits = make_input(p.numel(), dt, kind, seed++);
        for (MxScaleRule rule : {MxScaleRule::kOcpFloor, MxScaleRule::kRoundUp}) {
          for (ScaleLayout layout : kLayouts) {
            check_mxfp4(bits, p, dt, false, rule, layout);
            check_mxfp4(bits, p, dt, true, rule, layout);
          }
        }
      }
    }
  }
}

// Every BF16 / FP16 bit pattern goes through the NVFP4 (s_enc 1, amax-6 blocks) and MXFP4
// element paths: blocks of [6 or 0x7F7F-ish anchor, 15 consecutive patterns].
TEST(PackedGpu, EveryInputBitPattern) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes) {
    std::vector<uint16_t> bits;
    for (uint32_t u = 0; u < 65536; u += 15) {
      bits.push_back(to_bits(6.f, dt));
      for (uint32_t k = 0; k < 15; ++k) bits.push_back(static_cast<uint16_t>((u + k) & 0xFFFF));
    }
    while (bits.size() % 128) bits.push_back(0);
    const Shape p{1, static_cast<int64_t>(bits.size() / 128), 1, 128};
    for (Nvfp4ScaleRule rule : kNvRules) {
      check_nvfp4(bits, p, dt, false, rule, 1.f, ScaleLayout::kRowMajor);
      check_nvfp4(bits, p, dt, false, rule, 0.f, ScaleLayout::kRowMajor);
    }
    for (MxScaleRule rule : {MxScaleRule::kOcpFloor, MxScaleRule::kRoundUp}) {
      check_mxfp4(bits, p, dt, false, rule, ScaleLayout::kRowMajor);
    }
  }
}

TEST(PackedGpu, EmptyTensorsLaunchNothing) {
  SKIP_WITHOUT_GPU();
  for (const Shape& p : {Shape{0, 7, 3, 64}, Shape{2, 0, 3, 64}, Shape{2, 7, 0, 64}}) {
    Guarded packed(16), scales(16), s_out(4);
    ASSERT_TRUE(packed.ok() && scales.ok() && s_out.ok());
    const TensorView x = make_view(nullptr, DType::kBF16, {p.b, p.s, p.h, p.d});
    const TensorView pk = make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2});
    for (ScaleLayout layout : kLayouts) {
      Status st = quantize_packed_nvfp4_cuda(x, Nvfp4ScaleRule::kNearest, 0.f, layout, pk,
                                             scale_view(scales.get(), p, kNvfp4Block, layout),
                                             make_view(s_out.get(), DType::kF32, {1}), nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      st = quantize_packed_mxfp4_cuda(x, MxScaleRule::kOcpFloor, layout, pk,
                                      scale_view(scales.get(), p, kMxfp4Block, layout), nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (uint8_t v : packed.payload("packed")) EXPECT_EQ(v, kPoison);
    for (uint8_t v : scales.payload("scales")) EXPECT_EQ(v, kPoison);
    const std::vector<uint8_t> s = s_out.payload("s_enc_out");
    float f;
    std::memcpy(&f, s.data(), 4);
    EXPECT_EQ(f, 1.f);  // nvfp4_tensor_scale(0)
    Guarded amax(4);
    ASSERT_TRUE(tensor_amax_cuda(x, reinterpret_cast<float*>(amax.get()), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> a = amax.payload("amax");
    std::memcpy(&f, a.data(), 4);
    EXPECT_EQ(f, 0.f);
  }
}

// ---- amax -------------------------------------------------------------------------------------

TEST(TensorAmaxGpu, NanPropagatingAndExact) {
  SKIP_WITHOUT_GPU();
  const Shape p{3, 129, 5, 64};
  for (DType dt : kDtypes) {
    for (bool strided : {false, true}) {
      for (int variant = 0; variant < 5; ++variant) {
        std::vector<uint16_t> bits = make_input(p.numel(), dt, Input::kRandom, 11 + variant);
        const bool bf = dt == DType::kBF16;
        if (variant == 1) bits[12345] = bf ? 0xFF80 : 0xFC00;          // -Inf
        if (variant == 2) bits[p.numel() - 1] = bf ? 0x7FC0 : 0x7E00;  // NaN last
        if (variant == 3) {                                            // NaN and Inf
          bits[7] = bf ? 0xFFC1 : 0xFE01;
          bits[8] = bf ? 0x7F80 : 0x7C00;
        }
        if (variant == 4) {  // subnormals only
          for (auto& v : bits) v &= bf ? 0x807F : 0x83FF;
        }
        SCOPED_TRACE(std::string(dtype_name(dt)) + " variant " + std::to_string(variant) +
                     (strided ? " strided" : ""));
        const float want = host_amax(to_float(bits, dt));
        DeviceInput in = upload(bits, p, dt, strided);
        Guarded out(4);
        ASSERT_TRUE(in.buf->ok() && out.ok());
        const Status st =
            tensor_amax_cuda(in.view, make_view(out.get(), DType::kF32, {1}), nullptr);
        ASSERT_TRUE(st.ok()) << st.message();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<uint8_t> b = out.payload("amax");
        float got;
        std::memcpy(&got, b.data(), 4);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << got;
        } else {
          EXPECT_EQ(bits_of(got), bits_of(want)) << got << " vs " << want;
        }
      }
    }
  }
}

// ---- dequantizer ------------------------------------------------------------------------------

void check_dequant(PackedFormat fmt, const Shape& p, ScaleLayout layout, DType out_dt,
                   const Packed& ref, float s_enc, bool s_enc_on_device) {
  SCOPED_TRACE(std::string(fmt == PackedFormat::kNvfp4 ? "nvfp4" : "mxfp4") + " " +
               layout_name(layout) + " -> " + dtype_name(out_dt) + " shape " + str(p));
  const int block = fmt == PackedFormat::kNvfp4 ? kNvfp4Block : kMxfp4Block;
  Guarded packed(ref.packed), scales(ref.scales), s_dev(std::vector<float>{s_enc});
  Guarded out(p.numel() * dtype_size(out_dt));
  ASSERT_TRUE(packed.ok() && scales.ok() && s_dev.ok() && out.ok());
  PackedTensor in;
  in.format = fmt;
  in.packed = make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2});
  in.scales = scale_view(scales.get(), p, block, layout);
  in.layout = layout;
  in.s_enc = s_enc_on_device ? 1.f : s_enc;
  in.s_enc_device = s_enc_on_device ? reinterpret_cast<const float*>(s_dev.get()) : nullptr;
  const Status st =
      dequantize_packed_cuda(in, make_view(out.get(), out_dt, {p.b, p.s, p.h, p.d}), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> got = out.payload("out");
  std::vector<uint8_t> codes(p.numel()), row_scales(p.rows() * (p.d / block));
  unpack_e2m1_rows(ref.packed.data(), p.rows(), p.d, codes.data());
  if (layout == ScaleLayout::kRowMajor) {
    row_scales = ref.scales;
  } else {
    scales_from_swizzled(ref.scales.data(), p.rows(), p.d / block, row_scales.data());
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < p.numel() && bad < 5; ++i) {
    const uint8_t sc = row_scales[i / block];
    const float want = fmt == PackedFormat::kNvfp4 ? nvfp4_dequantize(codes[i], sc, s_enc)
                                                   : mxfp4_dequantize(codes[i], sc);
    float g;
    bool match;
    if (out_dt == DType::kF32) {
      std::memcpy(&g, &got[4 * i], 4);
      match = std::isnan(want) ? std::isnan(g) : bits_of(g) == bits_of(want);
    } else {
      uint16_t gb;
      std::memcpy(&gb, &got[2 * i], 2);
      g = bf16_bits_to_float(gb);
      match = std::isnan(want) ? std::isnan(g) : gb == float_to_bf16_bits(want);
    }
    if (!match) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": got " << g << ", want " << want;
    }
  }
}

TEST(DequantizePackedGpu, ExactAgainstHostDecode) {
  SKIP_WITHOUT_GPU();
  for (const Shape& p : {Shape{1, 7, 1, 16}, Shape{2, 129, 3, 64}, Shape{1, 7, 3, 96}}) {
    const std::vector<float> x =
        to_float(make_input(p.numel(), DType::kBF16, Input::kAdversarial, 3), DType::kBF16);
    for (ScaleLayout layout : kLayouts) {
      for (float s_enc : {1.f, 0.37f, 3.0e38f}) {
        const Packed ref = reference_nvfp4(x, p, s_enc, Nvfp4ScaleRule::kFourOverSix, layout);
        for (DType out_dt : {DType::kF32, DType::kBF16}) {
          check_dequant(PackedFormat::kNvfp4, p, layout, out_dt, ref, s_enc, false);
          check_dequant(PackedFormat::kNvfp4, p, layout, out_dt, ref, s_enc, true);
        }
      }
      if (p.d % kMxfp4Block == 0) {
        const Packed ref = reference_mxfp4(x, p, MxScaleRule::kOcpFloor, layout);
        for (DType out_dt : {DType::kF32, DType::kBF16}) {
          check_dequant(PackedFormat::kMxfp4, p, layout, out_dt, ref, 1.f, false);
        }
      }
    }
  }
}

// ---- repack -----------------------------------------------------------------------------------

// Repack of packed Q (GPU quantizer output) against quantize_operand_host of the original x:
// the same codes fold to the same bytes.
void check_repack(PackedFormat fmt, Recipe recipe, const Shape& p, ScaleLayout layout,
                  const std::vector<uint16_t>& bits) {
  SCOPED_TRACE(std::string(recipe_name(recipe)) + " " + layout_name(layout) + " shape " + str(p));
  constexpr float kSEnc = 448.f * 6.f / 5.f;
  const bool nv = fmt == PackedFormat::kNvfp4;
  const int block = nv ? kNvfp4Block : kMxfp4Block;
  Guarded x(bits), packed(p.numel() / 2), scales(scale_bytes(p, block, layout));
  const int64_t tiles = operand_scale_tiles(p.s);
  Guarded data(p.numel()), scale(4 * p.b * p.h * tiles);
  ASSERT_TRUE(x.ok() && packed.ok() && scales.ok() && data.ok() && scale.ok());
  const TensorView xv = make_view(x.get(), DType::kBF16, {p.b, p.s, p.h, p.d});
  const TensorView pk = make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2});
  const TensorView sc = scale_view(scales.get(), p, block, layout);
  // The recipe's Q rule (golden_operands.cc): four-over-six (nvfp4), restricted (nvfp4-hx),
  // nearest (fp4-direct); MXFP4 round-up.
  const Nvfp4ScaleRule rule = recipe == Recipe::kNvfp4Hx     ? Nvfp4ScaleRule::kRestricted
                              : recipe == Recipe::kFp4Direct ? Nvfp4ScaleRule::kNearest
                                                             : Nvfp4ScaleRule::kFourOverSix;
  Status st =
      nv ? quantize_packed_nvfp4_cuda(xv, rule, kSEnc, layout, pk, sc, TensorView{}, nullptr)
         : quantize_packed_mxfp4_cuda(xv, MxScaleRule::kRoundUp, layout, pk, sc, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  PackedTensor in;
  in.format = fmt;
  in.packed = pk;
  in.scales = sc;
  in.layout = layout;
  in.s_enc = kSEnc;
  const TensorView dv = make_view(data.get(), DType::kE4M3, {p.b, p.h, p.s, p.d});
  const TensorView sv = make_view(scale.get(), DType::kF32, {p.b, p.h, tiles});
  st = repack_to_operand_cuda(in, recipe, OperandRole::kQ, OperandOptions{}, dv, sv, TensorView{},
                              nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> want_data(p.numel());
  std::vector<float> want_scale(p.b * p.h * tiles);
  OperandOptions opt;
  opt.tensor_scale = nv ? kSEnc : 0.f;
  std::vector<uint16_t> host_bits = bits;
  st = quantize_operand_host(
      make_view(host_bits.data(), DType::kBF16, {p.b, p.s, p.h, p.d}), recipe, OperandRole::kQ, opt,
      make_view(want_data.data(), DType::kE4M3, {p.b, p.h, p.s, p.d}),
      make_view(want_scale.data(), DType::kF32, {p.b, p.h, tiles}), TensorView{});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(same_bytes(data.payload("data"), want_data)) << "operand data";
  std::vector<uint8_t> want_scale_bytes(4 * want_scale.size());
  std::memcpy(want_scale_bytes.data(), want_scale.data(), want_scale_bytes.size());
  EXPECT_TRUE(same_bytes(scale.payload("scale"), want_scale_bytes)) << "operand scale";
}

TEST(RepackGpu, QkFoldsEqualHostOperands) {
  SKIP_WITHOUT_GPU();
  for (const Shape& p : {Shape{2, 129, 3, 64}, Shape{1, 7, 2, 128}, Shape{1, 1, 1, 64}}) {
    for (Input kind : {Input::kRandom, Input::kAdversarial}) {
      const std::vector<uint16_t> bits = make_input(p.numel(), DType::kBF16, kind, 21);
      for (ScaleLayout layout : kLayouts) {
        for (Recipe r : {Recipe::kNvfp4, Recipe::kNvfp4Hx, Recipe::kFp4Direct}) {
          check_repack(PackedFormat::kNvfp4, r, p, layout, bits);
        }
        check_repack(PackedFormat::kMxfp4, Recipe::kMxfp4, p, layout, bits);
      }
    }
  }
}

// V (and any other combination) goes through a BF16 dequantization and quantize_operand_cuda:
// equal to quantize_operand_host of those BF16 values.
TEST(RepackGpu, OtherCombinationsViaBf16) {
  SKIP_WITHOUT_GPU();
  const Shape p{2, 33, 2, 64};
  const std::vector<float> x =
      to_float(make_input(p.numel(), DType::kBF16, Input::kRandom, 4), DType::kBF16);
  const Packed ref = reference_nvfp4(x, p, 1.f, Nvfp4ScaleRule::kNearest, ScaleLayout::kRowMajor);
  Guarded packed(ref.packed), scales(ref.scales);
  const int64_t pitch = operand_v_pitch(p.s);
  Guarded data(p.b * p.h * p.d * pitch), scale(4 * p.b * p.h * p.d);
  ASSERT_TRUE(packed.ok() && scales.ok() && data.ok() && scale.ok());
  PackedTensor in;
  in.packed = make_view(packed.get(), DType::kU8, {p.b, p.s, p.h, p.d / 2});
  in.scales = scale_view(scales.get(), p, kNvfp4Block, ScaleLayout::kRowMajor);
  in.s_enc = 1.f;
  const Status st = repack_to_operand_cuda(
      in, Recipe::kFp8, OperandRole::kV, OperandOptions{},
      make_view(data.get(), DType::kE4M3, {p.b, p.h, p.d, pitch}),
      make_view(scale.get(), DType::kF32, {p.b, p.h, p.d}), TensorView{}, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> codes(p.numel());
  unpack_e2m1_rows(ref.packed.data(), p.rows(), p.d, codes.data());
  std::vector<uint16_t> deq(p.numel());
  for (int64_t i = 0; i < p.numel(); ++i) {
    deq[i] = float_to_bf16_bits(nvfp4_dequantize(codes[i], ref.scales[i / kNvfp4Block], 1.f));
  }
  std::vector<uint8_t> want_data(p.b * p.h * p.d * pitch);
  std::vector<float> want_scale(p.b * p.h * p.d);
  ASSERT_TRUE(quantize_operand_host(
                  make_view(deq.data(), DType::kBF16, {p.b, p.s, p.h, p.d}), Recipe::kFp8,
                  OperandRole::kV, OperandOptions{},
                  make_view(want_data.data(), DType::kE4M3, {p.b, p.h, p.d, pitch}),
                  make_view(want_scale.data(), DType::kF32, {p.b, p.h, p.d}), TensorView{})
                  .ok());
  EXPECT_TRUE(same_bytes(data.payload("data"), want_data));
  std::vector<uint8_t> want_scale_bytes(4 * want_scale.size());
  std::memcpy(want_scale_bytes.data(), want_scale.data(), want_scale_bytes.size());
  EXPECT_TRUE(same_bytes(scale.payload("scale"), want_scale_bytes));
}

// ---- bad input (no GPU needed: validation precedes every CUDA call) ---------------------------

struct Fake {
  alignas(256) uint8_t bytes[1 << 16];
};

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(PackedBadInput, ErrorsNameTheArgument) {
  static Fake buf;
  void* p = buf.bytes;
  const Shape s{1, 4, 2, 64};
  const TensorView x = make_view(p, DType::kBF16, {s.b, s.s, s.h, s.d});
  const TensorView pk = make_view(p, DType::kU8, {s.b, s.s, s.h, s.d / 2});
  const TensorView sc = make_view(p, DType::kU8, {s.b, s.s, s.h, s.d / 16});
  const TensorView so = make_view(p, DType::kF32, {1});
  const auto nv = [&](const TensorView& xx, const TensorView& pp, const TensorView& ss,
                      float s_enc = 0.f, const TensorView& out = TensorView{},
                      ScaleLayout layout = ScaleLayout::kRowMajor) {
    return quantize_packed_nvfp4_cuda(xx, Nvfp4ScaleRule::kNearest, s_enc, layout, pp, ss, out,
                                      nullptr);
  };
  expect_error(nv(make_view(p, DType::kF32, {1, 4, 2, 64}), pk, sc, 1.f), "x: expected dtype");
  expect_error(nv(make_view(p, DType::kBF16, {4, 2, 64}), pk, sc, 1.f), "x: expected rank 4");
  expect_error(
      nv(make_strided_view(p, DType::kBF16, {1, 4, 2, 64}, {1024, 256, 128, 2}), pk, sc, 1.f),
      "x: the last dimension must be contiguous");
  expect_error(
      nv(make_view(static_cast<uint8_t*>(p) + 2, DType::kBF16, {1, 4, 2, 64}), pk, sc, 1.f),
      "x: data pointer must be 16-byte aligned");
  expect_error(
      nv(make_strided_view(p, DType::kBF16, {1, 4, 2, 64}, {1024, 256, 68, 1}), pk, sc, 1.f),
      "x: stride of dimension 2 must be a multiple of 8");
  expect_error(nv(make_view(p, DType::kBF16, {1, 4, 2, 24}), pk, sc, 1.f),
               "x: head_dim (24) must be a multiple of the block size 16");
  expect_error(nv(x, make_view(p, DType::kU8, {1, 4, 2, 64}), sc, 1.f), "packed: expected shape");
  expect_error(nv(x, make_view(p, DType::kF32, {1, 4, 2, 32}), sc, 1.f), "packed: expected dtype");
  expect_error(nv(x, make_view(static_cast<uint8_t*>(p) + 8, DType::kU8, {1, 4, 2, 32}), sc, 1.f),
               "packed: data pointer must be 16-byte aligned");
  expect_error(nv(x, pk, make_view(p, DType::kU8, {1, 4, 2, 8}), 1.f), "scales: expected shape");
  expect_error(
      nv(x, pk, make_view(p, DType::kU8, {100}), 1.f, TensorView{}, ScaleLayout::kSwizzled128x4),
      "scales: expected shape (512) or (128, 4)");
  expect_error(nv(x, pk, sc, -1.f), "s_enc: must be finite");
  expect_error(nv(x, pk, sc, std::numeric_limits<float>::quiet_NaN()), "s_enc: must be finite");
  expect_error(nv(x, pk, sc, 0.f), "s_enc_out: output tensor is required");
  expect_error(nv(x, pk, sc, 0.f, make_view(p, DType::kF32, {2})), "s_enc_out: expected shape");
  expect_error(
      quantize_packed_mxfp4_cuda(make_view(p, DType::kBF16, {1, 4, 2, 48}), MxScaleRule::kOcpFloor,
                                 ScaleLayout::kRowMajor, make_view(p, DType::kU8, {1, 4, 2, 24}),
                                 make_view(p, DType::kU8, {1, 4, 2, 1}), nullptr),
      "x: head_dim (48) must be a multiple of the block size 32");
  expect_error(quantize_packed_mxfp4_cuda(x, MxScaleRule::kOcpFloor, ScaleLayout::kRowMajor, pk,
                                          make_view(p, DType::kE4M3, {1, 4, 2, 2}), nullptr),
               "scales: expected dtype uint8");
  expect_error(tensor_amax_cuda(make_view(p, DType::kF32, {1, 4, 2, 64}), so, nullptr),
               "x: expected dtype");
  expect_error(tensor_amax_cuda(x, make_view(p, DType::kF32, {2}), nullptr),
               "amax: expected shape (1)");
  expect_error(tensor_amax_cuda(x, static_cast<float*>(nullptr), nullptr), "amax: device pointer");
  PackedTensor in;
  in.packed = make_view(p, DType::kU8, {1, 4, 2, 12});
  in.scales = make_view(p, DType::kU8, {1, 4, 2, 1});
  expect_error(dequantize_packed_cuda(in, make_view(p, DType::kF32, {1, 4, 2, 24}), nullptr),
               "in.packed: head_dim (2 * 12) must be a multiple of the block size 16");
  in.packed = pk;
  in.scales = sc;
  in.s_enc = 0.f;
  expect_error(dequantize_packed_cuda(in, make_view(p, DType::kF32, {1, 4, 2, 64}), nullptr),
               "in.s_enc: must be finite and > 0");
  in.s_enc = 1.f;
  expect_error(dequantize_packed_cuda(in, make_view(p, DType::kF16, {1, 4, 2, 64}), nullptr),
               "out: expected dtype");
  expect_error(dequantize_packed_cuda(in, make_view(p, DType::kF32, {1, 4, 2, 32}), nullptr),
               "out: expected shape (1, 4, 2, 64)");
  expect_error(repack_to_operand_cuda(in, Recipe::kNvfp4, OperandRole::kQ, OperandOptions{},
                                      make_view(p, DType::kE4M3, {1, 4, 2, 64}),
                                      make_view(p, DType::kF32, {1, 2, 1}), TensorView{}, nullptr),
               "data: expected shape (1, 2, 4, 64)");
  expect_error(repack_to_operand_cuda(in, Recipe::kNvfp4, OperandRole::kQ, OperandOptions{},
                                      make_view(p, DType::kE4M3, {1, 2, 4, 64}),
                                      make_view(p, DType::kF32, {1, 2, 2}), TensorView{}, nullptr),
               "scale: expected shape (1, 2, 1)");
}

}  // namespace
}  // namespace fp4attn
