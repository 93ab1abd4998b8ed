// GPU paged KV append (paged_kv_cuda.h) against the host paged_kv_append: the cache lives in one
// poisoned (0xAB) page pool with guard bytes after it; the host append runs on a byte copy of the
// same pool with the same view strides, so every byte of the pool (data, scales, padding, slots
// not written) and the bits of both globals must be equal after each append. Random and
// adversarial BF16/FP16 tokens, NVFP4 (every rule) and FP8, page sizes 16 and 64, head_dim 64 and
// 128, 8 and 1 kv heads, compact, interleaved and byte-misaligned pools, skipped slots, several
// appends (calibration only on the first), supplied scales (with the reference path of huge
// ones), empty appends, and bad input rejected before any launch. Skips without a GPU except the
// bad-input test, which needs no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/paged_kv_cuda.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

using testing::kGuard;
using testing::kPoison;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// ---- the page pool ------------------------------------------------------------------------------

// Where the four cache views live in the pool.
enum class Pool {
  kCompact,      // K data pages, K scale pages, V data pages, V scale pages, back to back
  kInterleaved,  // per page [K data | K scales | V data | V scales | 16 spare bytes] (vLLM-like)
  kMisaligned,   // interleaved, every view at an odd byte offset (byte stores in the kernel)
};

const char* pool_name(Pool p) {
  return p == Pool::kCompact ? "compact" : p == Pool::kInterleaved ? "interleaved" : "misaligned";
}

struct Geometry {
  KvCacheFormat format;
  int64_t pages, page_size, heads, d;
  Pool pool;
  Nvfp4ScaleRule rule = Nvfp4ScaleRule::kNearest;

  bool fp4() const { return format == KvCacheFormat::kNvfp4; }
  int64_t data_row() const { return fp4() ? d / 2 : d; }  // bytes per (token, head)
  int64_t scale_row() const { return fp4() ? d / 16 : 0; }
  int64_t data_page() const { return page_size * heads * data_row(); }
  int64_t scale_page() const { return page_size * heads * scale_row(); }
  int64_t pad() const { return pool == Pool::kMisaligned ? 3 : 0; }
  // Per-page stride and the offsets of (k data, k scales, v data, v scales).
  int64_t page_stride() const {
    if (pool == Pool::kCompact) return 0;  // unused
    return 2 * (data_page() + scale_page()) + 16 + 4 * pad();
  }
  int64_t bytes() const {
    return pool == Pool::kCompact ? 2 * pages * (data_page() + scale_page())
                                  : pages * page_stride() + 1;
  }
  void offsets(int64_t (&o)[4], int64_t& stride_data, int64_t& stride_scales) const {
    if (pool == Pool::kCompact) {
      o[0] = 0;
      o[1] = pages * data_page();
      o[2] = o[1] + pages * scale_page();
      o[3] = o[2] + pages * data_page();
      stride_data = data_page();
      stride_scales = scale_page();
      return;
    }
    o[0] = pad();
    o[1] = o[0] + data_page() + pad();
    o[2] = o[1] + scale_page() + pad();
    o[3] = o[2] + data_page() + pad();
    stride_data = stride_scales = page_stride();
  }
  std::string str() const {
    return std::string(kv_cache_format_name(format)) +
           (fp4() ? std::string(" ") + scale_rule_name(rule) : std::string()) + " pages " +
           std::to_string(pages) + "x" + std::to_string(page_size) + " heads " +
           std::to_string(heads) + " d " + std::to_string(d) + " " + pool_name(pool);
  }
};

// The cache views over a pool at `base` (device or host) and globals at `globals`.
PagedKvCache cache_views(const Geometry& g, uint8_t* base, float* globals) {
  int64_t o[4], sd, ss;
  g.offsets(o, sd, ss);
  auto view = [&](int64_t off, int64_t row, int64_t page_stride) {
    return make_strided_view(base + off, DType::kU8, {g.pages, g.page_size, g.heads, row},
                             {page_stride, g.heads * row, row, 1});
  };
  PagedKvCache c;
  c.format = g.format;
  c.rule = g.rule;
  c.k_data = view(o[0], g.data_row(), sd);
  c.v_data = view(o[2], g.data_row(), sd);
  if (g.fp4()) {
    c.k_scales = view(o[1], g.scale_row(), ss);
    c.v_scales = view(o[3], g.scale_row(), ss);
  }
  c.k_global = make_view(globals, DType::kF32, {1});
  c.v_global = make_view(globals + 1, DType::kF32, {1});
  return c;
}

using DeviceBuf = testing::GuardedBuffer;

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ == 0) first = static_cast<int64_t>(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " bytes differ, first at pool byte " << first << ": got " << int(got[first])
         << ", want " << int(want[first]);
}

// ---- tokens ------------------------------------------------------------------------------------

uint16_t to_bits(float v, DType dt) {
  return dt == DType::kBF16 ? float_to_bf16_bits(v) : float_to_f16_bits(v);
}

enum class Tokens { kRandom, kAdversarial, kBig };

// 16-bit bits of n values, block by block (16 values). Adversarial blocks cycle through E2M1 tie
// points at amax 6 (and +-1 ulp), subnormals (alone and with a normal), the largest finite values,
// a NaN, an Inf, all zero, +-0, one value far above the rest, tiny blocks (scale 0) and scaled
// normals; two whole blocks of NaN appear too (calibration must ignore them).
std::vector<uint16_t> make_tokens(int64_t n, DType dt, Tokens kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const bool bf = dt == DType::kBF16;
  const uint16_t max_finite = bf ? 0x7F7F : 0x7BFF, inf = bf ? 0x7F80 : 0x7C00,
                 nan = bf ? 0x7FC0 : 0x7E00, sub_max = bf ? 0x007F : 0x03FF;
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  std::vector<uint16_t> out(n);
  for (int64_t base = 0; base < n; base += 16) {
    const int pattern = kind == Tokens::kAdversarial ? static_cast<int>(rng() % 13) : -1;
    const float scale = std::ldexp(1.f, static_cast<int>(rng() % 25) - 12);
    for (int i = 0; i < 16 && base + i < n; ++i) {
      uint16_t v;
      switch (pattern) {
        case 0:
        case 1:
          v = i == 0 ? to_bits(6.f, dt) : to_bits((i % 2 ? -1.f : 1.f) * ties[i % 7], dt);
          if (pattern == 1 && i > 0) v = static_cast<uint16_t>(v + (rng() % 2 ? 1 : -1));
          break;
        case 2:
          v = static_cast<uint16_t>((rng() % sub_max) | (rng() % 2 ? 0x8000 : 0));
          break;
        case 3:
          v = i == 3 ? to_bits(0.01f, dt) : static_cast<uint16_t>(rng() % (sub_max + 1));
          break;
        case 4:
          v = static_cast<uint16_t>((max_finite - rng() % 64) | (i % 2 ? 0x8000 : 0));
          break;
        case 5:
          v = i == 5 ? nan : to_bits(normal(rng), dt);
          break;
        case 6:
          v = i == 9 ? static_cast<uint16_t>(inf | (rng() % 2 ? 0x8000 : 0))
                     : to_bits(normal(rng), dt);
          break;
        case 7:
          v = 0;
          break;
        case 8:
          v = i % 2 ? 0x8000 : 0;
          break;
        case 9:
          v = to_bits(i == 0 ? 1000.f : normal(rng) * 1e-3f, dt);
          break;
        case 10:
          v = to_bits(normal(rng) * (bf ? 1e-38f : 1e-7f), dt);
          break;
        case 11:
          v = to_bits(static_cast<float>(static_cast<int>(rng() % 13) - 6) * scale, dt);
          break;
        default:
          v = to_bits(normal(rng) * (kind == Tokens::kBig ? 50.f : 1.f) *
                          (kind == Tokens::kAdversarial ? scale : 1.f),
                      dt);
          break;
      }
      out[base + i] = v;
    }
  }
  if (kind == Tokens::kAdversarial && n >= 64) {
    for (int i = 32; i < 64; ++i) out[i] = nan;
  }
  return out;
}

// ---- one append on both sides -----------------------------------------------------------------

// A cache on the device and its host twin, appended to together.
class TwinCache {
 public:
  explicit TwinCache(const Geometry& g, float kg = 0.f, float vg = 0.f)
      : g_(g), host_(g.bytes(), kPoison), dev_(g.bytes()), globals_(2 * sizeof(float)) {
    host_globals_[0] = kg;
    host_globals_[1] = vg;
    ok_ = dev_.ok() && globals_.ok() &&
          cudaMemcpy(globals_.get(), host_globals_, 8, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  bool ok() const { return ok_; }
  bool calibrate = true;  // PagedAppendCudaOptions::calibrate of the device appends
  PagedKvCache device_view() {
    return cache_views(g_, dev_.get(), reinterpret_cast<float*>(globals_.get()));
  }

  // Appends n tokens (bits [n, heads, d] of k and v) on both sides and compares everything.
  // host_slots: the slots the host reference sees (out-of-range values already made -1 there).
  // Slot: int32_t or int64_t (slot_mapping I32 / I64). The device error flag of the call is
  // left in last_error_flag.
  template <typename Slot>
  void append(const std::vector<uint16_t>& kb, const std::vector<uint16_t>& vb, DType dt,
              const std::vector<Slot>& slots, const std::vector<int32_t>& host_slots,
              bool pass_host_slots, cudaStream_t stream) {
    constexpr DType kSlotDtype = sizeof(Slot) == 8 ? DType::kI64 : DType::kI32;
    const int64_t n = static_cast<int64_t>(slots.size());
    SCOPED_TRACE(g_.str() + " " + dtype_name(dt) + " n " + std::to_string(n));
    // Host reference.
    std::vector<int32_t> hs = host_slots;
    const Status hst = paged_kv_append(
        make_view(const_cast<uint16_t*>(kb.data()), dt, {n, g_.heads, g_.d}),
        make_view(const_cast<uint16_t*>(vb.data()), dt, {n, g_.heads, g_.d}),
        make_view(hs.data(), DType::kI32, {n}), cache_views(g_, host_.data(), host_globals_));
    ASSERT_TRUE(hst.ok()) << hst.message();
    // Device.
    DeviceBuf dk(kb), dv(vb), ds(slots), dflag(std::vector<int32_t>{0});
    ASSERT_TRUE(dk.ok() && dv.ok() && ds.ok() && dflag.ok());
    PagedAppendCudaOptions opt;
    opt.calibrate = calibrate;
    opt.error_flag = reinterpret_cast<int32_t*>(dflag.get());
    std::vector<Slot> copy = slots;
    if (pass_host_slots) opt.slot_mapping_host = make_view(copy.data(), kSlotDtype, {n});
    const Status st = paged_kv_append_cuda(
        make_view(n ? dk.get() : nullptr, dt, {n, g_.heads, g_.d}),
        make_view(n ? dv.get() : nullptr, dt, {n, g_.heads, g_.d}),
        make_view(n ? ds.get() : nullptr, kSlotDtype, {n}), device_view(), opt, stream);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGetLastError());
    const std::vector<uint8_t> fb = dflag.payload("error_flag");
    ASSERT_EQ(fb.size(), 4u);
    std::memcpy(&last_error_flag, fb.data(), 4);
    check();
    dk.payload("k");  // inputs' guards: nothing writes there
    dv.payload("v");
    ds.payload("slot_mapping");
  }

  // Every pool byte and both globals equal the host twin's; slots the host did not write still
  // hold the poison (checked against the host twin, whose test proves it keeps them).
  void check() {
    EXPECT_TRUE(same_bytes(dev_.payload("pool"), host_)) << "page pool";
    const std::vector<uint8_t> gb = globals_.payload("globals");
    ASSERT_EQ(gb.size(), 8u);
    float got[2];
    std::memcpy(got, gb.data(), 8);
    EXPECT_EQ(bits_of(got[0]), bits_of(host_globals_[0]))
        << "k_global " << got[0] << " vs " << host_globals_[0];
    EXPECT_EQ(bits_of(got[1]), bits_of(host_globals_[1]))
        << "v_global " << got[1] << " vs " << host_globals_[1];
  }

  int32_t last_error_flag = 0;
  float host_global(int side) const { return host_globals_[side]; }
  const std::vector<uint8_t>& host_pool() const { return host_; }

 private:
  Geometry g_;
  std::vector<uint8_t> host_;
  float host_globals_[2];
  DeviceBuf dev_, globals_;
  bool ok_ = false;
};

// n slots over a cache of `total` slots: distinct, scattered over pages, every 5th skipped.
std::vector<int32_t> scattered_slots(int64_t n, int64_t total, uint32_t seed) {
  std::vector<int32_t> perm(total);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> s(n);
  for (int64_t i = 0; i < n; ++i) s[i] = i % 5 == 4 ? -1 : perm[i];
  return s;
}

constexpr Nvfp4ScaleRule kRules[] = {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp,
                                     Nvfp4ScaleRule::kFourOverSix, Nvfp4ScaleRule::kRestricted};
constexpr DType kDtypes[] = {DType::kBF16, DType::kF16};

// ---- tests --------------------------------------------------------------------------------------

// The main sweep: every format and rule, both dtypes, both page sizes, head_dims, kv heads,
// random and adversarial tokens, calibrated on the first append; skipped slots throughout.
TEST(PagedAppendGpu, MatchesHostEveryByteAcrossShapes) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  uint32_t seed = 1;
  std::vector<std::pair<KvCacheFormat, Nvfp4ScaleRule>> formats = {
      {KvCacheFormat::kFp8, Nvfp4ScaleRule::kNearest}};
  for (Nvfp4ScaleRule r : kRules) formats.push_back({KvCacheFormat::kNvfp4, r});
  for (const auto& [format, rule] : formats) {
    for (int64_t page_size : {16, 64}) {
      for (int64_t d : {64, 128}) {
        for (int64_t heads : {8, 1}) {
          for (DType dt : kDtypes) {
            for (Tokens kind : {Tokens::kRandom, Tokens::kAdversarial}) {
              const Pool pool = seed % 3 == 0   ? Pool::kCompact
                                : seed % 3 == 1 ? Pool::kInterleaved
                                                : Pool::kMisaligned;
              const Geometry g{format, 7, page_size, heads, d, pool, rule};
              TwinCache c(g);
              ASSERT_TRUE(c.ok());
              const int64_t n = 3 * page_size + 5;
              const auto slots = scattered_slots(n, g.pages * page_size, seed);
              c.append(make_tokens(n * heads * d, dt, kind, seed),
                       make_tokens(n * heads * d, dt, kind, seed + 1000), dt, slots, slots,
                       seed % 2 == 0, stream);
              ++seed;
              if (::testing::Test::HasFailure()) {
                cudaStreamDestroy(stream);
                return;
              }
            }
          }
        }
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// Several appends into one cache: the first calibrates (K and V separately), later ones keep the
// globals, including one whose tokens are 50x larger (their blocks saturate as on the host) and
// one that writes nothing. Both dtypes, every pool.
TEST(PagedAppendGpu, SeveralAppendsCalibrateOnlyOnTheFirst) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (Pool pool : {Pool::kCompact, Pool::kInterleaved, Pool::kMisaligned}) {
      for (DType dt : kDtypes) {
        const Geometry g{format, 9, 16, 8, 128, pool, Nvfp4ScaleRule::kNearest};
        TwinCache c(g);
        ASSERT_TRUE(c.ok());
        std::vector<int32_t> perm(g.pages * g.page_size);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
        const int64_t row = g.heads * g.d;
        int64_t next = 0;
        auto take = [&](int64_t n) {
          std::vector<int32_t> s(perm.begin() + next, perm.begin() + next + n);
          next += n;
          return s;
        };
        // 1: a prefill chunk of 40 tokens, calibrates.
        auto s1 = take(40);
        c.append(make_tokens(40 * row, dt, Tokens::kAdversarial, 11),
                 make_tokens(40 * row, dt, Tokens::kRandom, 12), dt, s1, s1, true, nullptr);
        const float kg = c.host_global(0), vg = c.host_global(1);
        EXPECT_NE(kg, 0.f);
        EXPECT_NE(vg, 0.f);
        EXPECT_NE(kg, vg);
        // 2: decode steps of several sequences, larger tokens: same globals, saturation.
        auto s2 = take(6);
        c.append(make_tokens(6 * row, dt, Tokens::kBig, 13),
                 make_tokens(6 * row, dt, Tokens::kBig, 14), dt, s2, s2, false, nullptr);
        EXPECT_EQ(c.host_global(0), kg);
        EXPECT_EQ(c.host_global(1), vg);
        // 3: nothing written.
        const std::vector<int32_t> none = {-1, -1, -1};
        c.append(make_tokens(3 * row, dt, Tokens::kBig, 15),
                 make_tokens(3 * row, dt, Tokens::kBig, 16), dt, none, none, true, nullptr);
        // 4: one token.
        auto s4 = take(1);
        c.append(make_tokens(row, dt, Tokens::kAdversarial, 17),
                 make_tokens(row, dt, Tokens::kAdversarial, 18), dt, s4, s4, true, nullptr);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// An append whose written tokens have finite amax 0 (+-0, then NaN/Inf and zeros; a skipped
// token of data does not count) leaves both globals 0 on the device, as on the host; the next
// append with data calibrates them to what one append of that data gives. Every byte and both
// globals equal the host twin's after each append.
TEST(PagedAppendGpu, ZeroFirstAppendLeavesGlobalsUncalibrated) {
  SKIP_WITHOUT_GPU();
  std::vector<std::pair<KvCacheFormat, Nvfp4ScaleRule>> formats = {
      {KvCacheFormat::kFp8, Nvfp4ScaleRule::kNearest}};
  for (Nvfp4ScaleRule r : kRules) formats.push_back({KvCacheFormat::kNvfp4, r});
  for (const auto& [format, rule] : formats) {
    for (DType dt : kDtypes) {
      const Geometry g{format, 6, 16, 8, 128, Pool::kInterleaved, rule};
      TwinCache c(g);
      ASSERT_TRUE(c.ok());
      const int64_t row = g.heads * g.d;
      const uint16_t nan = dt == DType::kBF16 ? 0x7FC0 : 0x7E00;
      const uint16_t inf = dt == DType::kBF16 ? 0x7F80 : 0x7C00;
      // 1: zeros and -0; token 3 (data) skipped.
      std::vector<uint16_t> zeros(4 * row, 0);
      for (int64_t i = 1; i < 3 * row; i += 3) zeros[i] = 0x8000;
      const std::vector<uint16_t> data = make_tokens(row, dt, Tokens::kRandom, 71);
      std::copy(data.begin(), data.end(), zeros.begin() + 3 * row);
      const std::vector<int32_t> s1 = {0, 1, 2, -1};
      c.append(zeros, zeros, dt, s1, s1, true, nullptr);
      EXPECT_EQ(c.host_global(0), 0.f);
      EXPECT_EQ(c.host_global(1), 0.f);
      // 2: NaN, +-Inf and zeros only.
      std::vector<uint16_t> bad(2 * row, 0);
      for (int64_t i = 0; i < 2 * row; i += 7) {
        bad[i] = i % 3 == 0 ? nan : static_cast<uint16_t>(inf | (i % 2 ? 0x8000 : 0));
      }
      const std::vector<int32_t> s2 = {17, 40};
      c.append(bad, bad, dt, s2, s2, false, nullptr);
      EXPECT_EQ(c.host_global(0), 0.f);
      EXPECT_EQ(c.host_global(1), 0.f);
      // 3: data calibrates.
      const std::vector<uint16_t> k3 = make_tokens(30 * row, dt, Tokens::kAdversarial, 72);
      const std::vector<uint16_t> v3 = make_tokens(30 * row, dt, Tokens::kRandom, 73);
      const auto s3 = scattered_slots(30, 96, 74);
      std::vector<int32_t> s3_free = s3;  // the slots of appends 1 and 2 are taken: skip those
      for (int32_t& s : s3_free) {
        if (s <= 2 || s == 17 || s == 40) s = -1;
      }
      c.append(k3, v3, dt, s3_free, s3_free, true, nullptr);
      TwinCache once(g);
      ASSERT_TRUE(once.ok());
      once.append(k3, v3, dt, s3_free, s3_free, true, nullptr);
      EXPECT_NE(c.host_global(0), 0.f);
      EXPECT_EQ(c.host_global(0), once.host_global(0));
      EXPECT_EQ(c.host_global(1), once.host_global(1));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Supplied globals: used as given, also the extremes (1e30: s_enc / scale overflows, the kernel's
// reference path; 1e-30: every block scale 0), and one side supplied, the other calibrated.
TEST(PagedAppendGpu, SuppliedGlobals) {
  SKIP_WITHOUT_GPU();
  const float nv[][2] = {{1.f, 1.f}, {0.37f, 2688.f}, {1e30f, 1e-30f}, {3e38f, 0.f}, {0.f, 100.f}};
  const float f8[][2] = {{0.02f, 0.5f}, {1e-30f, 1e30f}, {0.f, 0.01f}};
  for (DType dt : kDtypes) {
    for (Nvfp4ScaleRule rule : kRules) {
      for (const auto& gs : nv) {
        const Geometry g{KvCacheFormat::kNvfp4, 5, 16, 2, 64, Pool::kInterleaved, rule};
        TwinCache c(g, gs[0], gs[1]);
        ASSERT_TRUE(c.ok());
        const auto slots = scattered_slots(30, 80, 21);
        c.append(make_tokens(30 * 128, dt, Tokens::kAdversarial, 22),
                 make_tokens(30 * 128, dt, Tokens::kAdversarial, 23), dt, slots, slots, true,
                 nullptr);
        if (gs[0] != 0.f) EXPECT_EQ(c.host_global(0), gs[0]);
      }
    }
    for (const auto& gs : f8) {
      const Geometry g{KvCacheFormat::kFp8, 5, 16, 2, 64, Pool::kCompact};
      TwinCache c(g, gs[0], gs[1]);
      ASSERT_TRUE(c.ok());
      const auto slots = scattered_slots(30, 80, 24);
      c.append(make_tokens(30 * 128, dt, Tokens::kAdversarial, 25),
               make_tokens(30 * 128, dt, Tokens::kAdversarial, 26), dt, slots, slots, false,
               nullptr);
    }
  }
}

// Without calibration the stored globals are used as they are (one launch); the host twin with
// the same supplied globals writes the same bytes.
TEST(PagedAppendGpu, CalibrateOffUsesStoredGlobals) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    const Geometry g{format, 4, 64, 8, 128, Pool::kCompact};
    TwinCache c(g, format == KvCacheFormat::kFp8 ? 0.01f : 150.f, 300.f);
    ASSERT_TRUE(c.ok());
    c.calibrate = false;
    const int64_t n = 100, row = g.heads * g.d;
    const auto slots = scattered_slots(n, g.pages * g.page_size, 31);
    c.append(make_tokens(n * row, DType::kBF16, Tokens::kRandom, 32),
             make_tokens(n * row, DType::kBF16, Tokens::kAdversarial, 33), DType::kBF16, slots,
             slots, true, nullptr);
  }
}

// A batch large enough for the grid-stride loop (more units than the grid has threads), and
// vLLM-style slot values beyond the cache when no host copy is passed: skipped, never written.
TEST(PagedAppendGpu, LargeAppendAndUncheckedOutOfRangeSlots) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    const Geometry g{format, 600, 16, 8, 128, Pool::kInterleaved};
    TwinCache c(g);
    ASSERT_TRUE(c.ok());
    const int64_t n = 9000, row = g.heads * g.d;
    std::vector<int32_t> slots = scattered_slots(n, g.pages * g.page_size, 41);
    std::vector<int32_t> host = slots;
    const int32_t total = static_cast<int32_t>(g.pages * g.page_size);
    for (int64_t i = 7; i < n; i += 97) {
      slots[i] = i % 2 ? total + static_cast<int32_t>(i) : 0x7FFFFFFF;  // out of range
      host[i] = -1;  // what the kernel does with them
    }
    c.append(make_tokens(n * row, DType::kBF16, Tokens::kAdversarial, 42),
             make_tokens(n * row, DType::kBF16, Tokens::kRandom, 43), DType::kBF16, slots, host,
             /*pass_host_slots=*/false, nullptr);
    EXPECT_EQ(c.last_error_flag, kPagedErrorSlotPastCache);
  }
}

// vLLM's int64 slot_mapping, read at full width: negative (any magnitude, -1 is vLLM's graph
// padding) skips the token and is no error; past the cache (also beyond int32) skips it and sets
// the error flag; nothing wraps onto a real slot (-2^32 + 3 is not slot 3). With a host copy the
// same values are checked before the launch.
TEST(PagedAppendGpu, Int64SlotsAreReadAtFullWidth) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    const Geometry g{format, 4, 16, 2, 64, Pool::kCompact};
    const int64_t total = g.pages * g.page_size, row = g.heads * g.d;
    const std::vector<int64_t> slots = {5,         -1, -(int64_t{1} << 32) + 3,
                                        INT64_MIN, 7,  -(int64_t{1} << 32)};
    const std::vector<int32_t> host = {5, -1, -1, -1, 7, -1};
    const int64_t n = static_cast<int64_t>(slots.size());
    {
      TwinCache c(g);
      ASSERT_TRUE(c.ok());
      c.append(make_tokens(n * row, DType::kBF16, Tokens::kRandom, 61),
               make_tokens(n * row, DType::kBF16, Tokens::kRandom, 62), DType::kBF16, slots, host,
               /*pass_host_slots=*/true, nullptr);
      EXPECT_EQ(c.last_error_flag, 0) << "negative slots are padding, not errors";
    }
    std::vector<int64_t> past = slots;
    past[1] = total;
    past[3] = int64_t{1} << 32;  // would be slot 0 if narrowed
    TwinCache c(g);
    ASSERT_TRUE(c.ok());
    c.append(make_tokens(n * row, DType::kBF16, Tokens::kRandom, 63),
             make_tokens(n * row, DType::kBF16, Tokens::kRandom, 64), DType::kBF16, past, host,
             /*pass_host_slots=*/false, nullptr);
    EXPECT_EQ(c.last_error_flag, kPagedErrorSlotPastCache);
  }
}

// An empty append and an all-skipped one change nothing: poison intact, globals still 0.
TEST(PagedAppendGpu, EmptyAndAllSkippedAppendsWriteNothing) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    const Geometry g{format, 3, 16, 8, 64, Pool::kCompact};
    TwinCache c(g);
    ASSERT_TRUE(c.ok());
    c.append({}, {}, DType::kF16, std::vector<int32_t>{}, {}, true, nullptr);
    const std::vector<int32_t> none(4, -1);
    c.append(make_tokens(4 * 8 * 64, DType::kF16, Tokens::kRandom, 51),
             make_tokens(4 * 8 * 64, DType::kF16, Tokens::kRandom, 52), DType::kF16, none, none,
             true, nullptr);
    EXPECT_EQ(c.host_global(0), 0.f);
    EXPECT_EQ(c.host_global(1), 0.f);
    for (uint8_t b : c.host_pool()) ASSERT_EQ(b, kPoison);
  }
}

// Bad input: a Status naming the argument, before any CUDA call. The pointers are fake (never
// dereferenced); on a GPU machine the absence of a launch shows as no CUDA error afterwards.
TEST(PagedAppendGpu, BadInputIsRejectedBeforeAnyLaunch) {
  auto* fake = reinterpret_cast<uint8_t*>(uintptr_t{1} << 20);
  const Geometry g{KvCacheFormat::kNvfp4, 4, 16, 2, 64, Pool::kCompact};
  float* globals = reinterpret_cast<float*>(fake + (1 << 16));
  const PagedKvCache cache = cache_views(g, fake, globals);
  const int64_t n = 3;
  const TensorView k = make_view(fake, DType::kBF16, {n, 2, 64});
  const TensorView slots = make_view(fake, DType::kI32, {n});
  std::vector<int32_t> host_ok = {0, 5, -1}, host_dup = {4, 9, 4}, host_oob = {0, 64, 1};
  auto run = [&](const TensorView& kk, const TensorView& vv, const TensorView& ss,
                 const PagedKvCache& cc, std::vector<int32_t>* host) {
    PagedAppendCudaOptions opt;
    if (host != nullptr) {
      opt.slot_mapping_host =
          make_view(host->data(), DType::kI32, {static_cast<int64_t>(host->size())});
    }
    return paged_kv_append_cuda(kk, vv, ss, cc, opt, nullptr);
  };
  struct Case {
    const char* what;
    Status st;
    const char* expect;
  };
  PagedKvCache bad_global = cache;
  bad_global.k_global = make_view(globals, DType::kF32, {2});
  PagedKvCache bad_scales = cache;
  bad_scales.v_scales = make_view(fake, DType::kU8, {4, 16, 2, 3});
  Geometry g48 = g;
  g48.d = 40;  // not a multiple of 16
  PagedKvCache bad_rule = cache;
  bad_rule.rule = static_cast<Nvfp4ScaleRule>(9);
  const Case cases[] = {
      {"f32 tokens",
       run(make_view(fake, DType::kF32, {n, 2, 64}), make_view(fake, DType::kF32, {n, 2, 64}),
           slots, cache, nullptr),
       "k: dtype"},
      {"v dtype", run(k, make_view(fake, DType::kF16, {n, 2, 64}), slots, cache, nullptr),
       "v: expected dtype"},
      {"misaligned k", run(make_view(fake + 2, DType::kBF16, {n, 2, 64}), k, slots, cache, nullptr),
       "k:"},
      {"k stride",
       run(make_strided_view(fake, DType::kBF16, {n, 2, 64}, {132, 66, 1}), k, slots, cache,
           nullptr),
       "k: stride"},
      {"kv heads", run(make_view(fake, DType::kBF16, {n, 3, 64}), k, slots, cache, nullptr),
       "k: expected shape"},
      {"slot count", run(k, k, make_view(fake, DType::kI32, {n + 1}), cache, nullptr),
       "slot_mapping"},
      {"slot dtype", run(k, k, make_view(fake, DType::kU8, {n}), cache, nullptr), "slot_mapping"},
      {"duplicate slot", run(k, k, slots, cache, &host_dup), "slot_mapping[2]"},
      {"slot out of range", run(k, k, slots, cache, &host_oob), "slot_mapping[1]"},
      {"host slot shape", run(k, k, slots, cache, &(host_ok = {0, 1})), "opt.slot_mapping_host"},
      {"global shape", run(k, k, slots, bad_global, nullptr), "k_global"},
      {"scale shape", run(k, k, slots, bad_scales, nullptr), "v_scales"},
      {"head_dim",
       run(make_view(fake, DType::kBF16, {n, 2, 40}), make_view(fake, DType::kBF16, {n, 2, 40}),
           slots, cache_views(g48, fake, globals), nullptr),
       "head_dim"},
      {"rule", run(k, k, slots, bad_rule, nullptr), "cache.rule"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.st.ok()) << c.what;
    EXPECT_NE(c.st.message().find(c.expect), std::string::npos)
        << c.what << ": \"" << c.st.message() << "\" should mention \"" << c.expect << "\"";
  }
  EXPECT_TRUE(cases[0].st.unsupported()) << "F32 tokens are a valid request the GPU lacks";
  if (::fp4attn::testing::have_gpu()) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace fp4attn
