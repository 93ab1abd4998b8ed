// The GPU backward (attention_bwd_cuda.h) against the CPU golden backward with the GPU's FP8
// arithmetic (BackwardArithmetic::kEmulatedFp8) and against the float64 backward: causal and
// not, GQA, d 64 and 128, odd lengths, s_q != s_k, poisoned outputs, BF16 outputs,
// deterministic mode, bad input before any launch. The forward's O and LSE come from the GPU
// forward and are given to both backwards, so only the backward is compared. Fresh random inputs
// each run (the seed is printed on failure). Skips when no GPU is present.
//
// DSource::kHighPrecisionO: against the golden model's emulated high-precision-o, the key-bias
// share of dK, deterministic runs.
//
// Filters: 'BwdGpu.*', 'Shapes/BwdGpuShapes.*', 'Shapes/BwdGpuHighPrecisionO.*'.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/attention_bwd_cuda.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/golden/golden_backward.h"
#include "harness/metrics.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

using testing::DeviceArray;
using testing::fresh_seed;

// GPU vs golden kEmulatedFp8 (same operands, same scales, same roundings). What differs:
//  * FP32 accumulation of the MMAs (Hopper's FP8 MMA adds with ~13-14 mantissa bits) against
//    float64 sums: relative error ~1e-4 of dP and S;
//  * exp2f and the FP32 score transform: p moves by ~|z| 2^-23 ~ 1e-5 relative;
//  * these move P and dS before their E4M3 rounding: an element within ~1e-4 of a rounding
//    boundary flips one E4M3 step (1/8 of its value at most); with steps 2^-3 apart in relative
//    terms that is ~2e-4 / 2^-3 ~ 2e-3 of the elements. The gradient is a sum of such products, so
//    its rel-L2 moves by ~sqrt(2e-3) * 1/8 ~ 6e-3, the MMA's own 1e-4 being negligible;
//  * dP - D cancels: dS of rows where dP ~ D carries dP's absolute error, small in L2.
// Bound: 3x that estimate. Gradients with few elements average fewer flips: looser bound.
constexpr double kMaxRelL2VsGolden = 0.02;
constexpr double kMaxRelL2VsGoldenSmall = 0.05;
constexpr int64_t kSmallGradient = 16384;
// The golden model's emulated gradients are within rel-L2 0.06 of float64 (numerics.md §8), i.e.
// cosine ~0.998; the issue's target for nvfp4 is 0.99.
constexpr double kMinCosVsF64 = 0.99;

struct Problem {
  int64_t b, s_q, s_k, h, h_kv, d;
  bool causal;
  Recipe recipe = Recipe::kFp8;
  std::string name() const {
    std::ostringstream os;
    os << "b" << b << "_sq" << s_q << "_sk" << s_k << "_h" << h << "_hkv" << h_kv << "_d" << d
       << (causal ? "_causal" : "");
    std::string r = recipe_name(recipe);
    for (char& ch : r) ch = ch == '-' ? '_' : ch;
    os << "_" << r;
    return os.str();
  }
  int64_t nq() const { return b * s_q * h * d; }
  int64_t nk() const { return b * s_k * h_kv * d; }
};

std::vector<uint16_t> random_bf16(int64_t n, std::mt19937_64& rng, float sigma) {
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(dist(rng));
  return v;
}

// Host inputs and the GPU forward's saved O / LSE / row_max.
struct Inputs {
  std::vector<uint16_t> q, k, v, dout, o;
  std::vector<float> lse, row_max;
};

Inputs make_inputs(const Problem& pb, std::mt19937_64& rng) {
  Inputs in;
  in.q = random_bf16(pb.nq(), rng, 1.f);
  in.k = random_bf16(pb.nk(), rng, 1.f);
  in.v = random_bf16(pb.nk(), rng, 1.f);
  in.dout = random_bf16(pb.nq(), rng, 1e-3f);  // small, as a loss gradient: the scales absorb it
  return in;
}

struct Grads {
  std::vector<float> dq, dk, dv;           // F32 runs
  std::vector<uint16_t> dq16, dk16, dv16;  // BF16 runs
};

// Forward then backward on the GPU (fills in.o / in.lse / in.row_max from the forward; the
// backward gets row_max, which only nvfp4-fast reads). Gradients poisoned with NaN first.
Status run_gpu(const Problem& pb, Inputs* in, DType grad_type, bool deterministic, Grads* g,
               DSource d_source = DSource::kForwardO) {
  DeviceArray<uint16_t> q(in->q.size()), k(in->k.size()), v(in->v.size()), o(pb.nq()),
      dout(in->dout.size());
  DeviceArray<float> lse(pb.b * pb.h * pb.s_q), row_max(pb.b * pb.h * pb.s_q);
  cudaMemset(row_max.ptr, 0xFF, pb.b * pb.h * pb.s_q * sizeof(float));  // NaN: must be written
  // O too: the forward must write every element (and compute-sanitizer initcheck does not see
  // its TMA stores, so an unpoisoned O reads as uninitialized in the backward's prep pass).
  cudaMemset(o.ptr, 0xFF, pb.nq() * sizeof(uint16_t));
  q.upload(in->q);
  k.upload(in->k);
  v.upload(in->v);
  dout.upload(in->dout);
  ForwardOptions opt;
  opt.recipe = pb.recipe;
  opt.causal = pb.causal;
  const TensorView tq = make_view(q.ptr, DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d});
  const TensorView tk = make_view(k.ptr, DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d});
  const TensorView tv = make_view(v.ptr, DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d});
  const TensorView to = make_view(o.ptr, DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d});
  const TensorView tl = make_view(lse.ptr, DType::kF32, {pb.b, pb.h, pb.s_q});
  const TensorView tm = make_view(row_max.ptr, DType::kF32, {pb.b, pb.h, pb.s_q});
  const TensorView tdo = make_view(dout.ptr, DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d});
  Status st = attention_forward_cuda(tq, tk, tv, opt, to, tl, nullptr, tm);
  if (!st.ok()) return st;
  const size_t es = grad_type == DType::kF32 ? 4 : 2;
  testing::GuardedBuffer dq(pb.nq() * es), dk(pb.nk() * es), dv(pb.nk() * es);
  // NaN in F32 and BF16: 0xFF bytes. GuardedBuffer poisons with 0xAB (a finite value), so set
  // the payload to NaN here and keep the 0xAB guards.
  cudaMemset(dq.get(), 0xFF, pb.nq() * es);
  cudaMemset(dk.get(), 0xFF, pb.nk() * es);
  cudaMemset(dv.get(), 0xFF, pb.nk() * es);
  BackwardCudaOptions bopt;
  bopt.deterministic = deterministic;
  bopt.d_source = d_source;
  st = attention_backward_cuda(
      tq, tk, tv, opt, to, tl, tdo, make_view(dq.get(), grad_type, {pb.b, pb.s_q, pb.h, pb.d}),
      make_view(dk.get(), grad_type, {pb.b, pb.s_k, pb.h_kv, pb.d}),
      make_view(dv.get(), grad_type, {pb.b, pb.s_k, pb.h_kv, pb.d}), bopt, nullptr, tm);
  in->row_max = row_max.download();
  if (!st.ok()) return st;
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    return Status::Invalid(std::string("kernel failed: ") + cudaGetErrorString(e));
  in->o = o.download();
  in->lse = lse.download();
  auto take = [&](const testing::GuardedBuffer& buf, const char* what, auto* out) {
    const std::vector<uint8_t> bytes = buf.payload(what);
    out->resize(bytes.size() / sizeof((*out)[0]));
    if (!bytes.empty()) std::memcpy(out->data(), bytes.data(), bytes.size());
  };
  if (grad_type == DType::kF32) {
    take(dq, "dq", &g->dq);
    take(dk, "dk", &g->dk);
    take(dv, "dv", &g->dv);
  } else {
    take(dq, "dq", &g->dq16);
    take(dk, "dk", &g->dk16);
    take(dv, "dv", &g->dv16);
  }
  return Status::Ok();
}

struct GoldenGrads {
  std::vector<double> dq, dk, dv;
};

// The golden model with the GPU's dS scales (per tile, DsScales::kPerTile).
GoldenGrads run_golden(const Problem& pb, Inputs& in, BackwardArithmetic arith,
                       DSource d_source = DSource::kForwardO) {
  GoldenGrads g;
  g.dq.resize(pb.nq());
  g.dk.resize(pb.nk());
  g.dv.resize(pb.nk());
  RecipeOptions opt;
  opt.recipe = pb.recipe;
  opt.causal = pb.causal;
  BackwardOptions bopt;
  bopt.arithmetic = arith;
  bopt.d_source = d_source;
  bopt.ds_scales = DsScales::kPerTile;
  const Status st = golden_attention_backward(
      make_view(in.q.data(), DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d}),
      make_view(in.k.data(), DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d}),
      make_view(in.v.data(), DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d}),
      make_view(in.o.data(), DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d}),
      make_view(in.dout.data(), DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d}),
      make_view(in.lse.data(), DType::kF32, {pb.b, pb.h, pb.s_q}), opt,
      make_view(g.dq.data(), DType::kF64, {pb.b, pb.s_q, pb.h, pb.d}),
      make_view(g.dk.data(), DType::kF64, {pb.b, pb.s_k, pb.h_kv, pb.d}),
      make_view(g.dv.data(), DType::kF64, {pb.b, pb.s_k, pb.h_kv, pb.d}), bopt);
  EXPECT_TRUE(st.ok()) << st.message();
  return g;
}

ErrorStats stats(const std::vector<float>& x, const std::vector<double>& ref) {
  if (x.size() != ref.size()) return ErrorStats{-1};
  const std::vector<double> xd(x.begin(), x.end());
  return compare(xd.data(), ref.data(), int64_t(ref.size()));
}

int64_t count_nan(const std::vector<float>& x) {
  int64_t n = 0;
  for (float v : x) n += std::isnan(v);
  return n;
}

void expect_close(const char* what, const std::vector<float>& x, const std::vector<double>& ref) {
  const ErrorStats s = stats(x, ref);
  const double bound =
      int64_t(ref.size()) < kSmallGradient ? kMaxRelL2VsGoldenSmall : kMaxRelL2VsGolden;
  EXPECT_EQ(count_nan(x), 0) << what << ": elements left unwritten (poison) or NaN";
  EXPECT_LE(s.rel_l2, bound) << what << " vs golden kEmulatedFp8: " << to_string(s);
}

class BwdGpuShapes : public ::testing::TestWithParam<Problem> {};

TEST_P(BwdGpuShapes, MatchesEmulatedGolden) {
  SKIP_WITHOUT_GPU();
  const Problem pb = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " " + pb.name());
  std::mt19937_64 rng(seed);
  Inputs in = make_inputs(pb, rng);
  Grads g;
  const Status st = run_gpu(pb, &in, DType::kF32, false, &g);
  ASSERT_TRUE(st.ok()) << st.message();
  const GoldenGrads ref = run_golden(pb, in, BackwardArithmetic::kEmulatedFp8);
  expect_close("dq", g.dq, ref.dq);
  expect_close("dk", g.dk, ref.dk);
  expect_close("dv", g.dv, ref.dv);
}

std::vector<Problem> shapes() {
  return {
      {1, 17, 333, 4, 2, 64, true, Recipe::kFp8},      // s_q < s_k, bottom-right causal, GQA 4/2
      {1, 17, 333, 4, 2, 128, false, Recipe::kNvfp4},  // odd lengths, tails of both
      {1, 333, 17, 4, 1, 128, true, Recipe::kNvfp4},   // rows without keys, MQA 4/1
      {2, 100, 200, 4, 4, 128, false, Recipe::kNvfp4Hx},
      {1, 256, 256, 4, 1, 64, true, Recipe::kMxfp4},  // GQA 4/1
      {1, 130, 130, 2, 2, 128, true, Recipe::kFp8},
      {1, 65, 190, 4, 2, 64, false, Recipe::kNvfp4},
      {2, 96, 96, 4, 2, 128, true, Recipe::kMxfp4},
      {1, 200, 333, 4, 2, 128, true, Recipe::kNvfp4Fast},  // the exp-free codes, GQA, tails
      {1, 333, 17, 4, 1, 64, true, Recipe::kNvfp4Fast},    // rows without keys
      {2, 130, 130, 2, 2, 64, false, Recipe::kNvfp4Fast},
      {1, 190, 260, 4, 2, 128, true, Recipe::kNvfp4All},   // exp2 P from the LSE, as fp8's
      {1, 200, 333, 4, 2, 128, true, Recipe::kFp4Direct},  // E2M1 codes per 32-key block
      {1, 333, 17, 4, 1, 64, true, Recipe::kFp4Direct},    // rows without keys, a partial block
      {2, 130, 130, 2, 2, 64, false, Recipe::kFp4Direct},
  };
}

// The forward's row_max is each row's integer log2 reference m = ceil(max z): an integer with
// 2^(LSE log2 e - m) the row's denominator in units of 2^m: n terms, each at most 1, the largest
// at least 1/2 (exp2 and the codes: 2^(z - m) with z - m in (-1, 0]; fp4-direct: its
// top block's largest q 2^e / 6 is 1/2 or more), so 2^(LSE log2 e - m + 8) lies in [128, 256 n]
// for n visible keys. Rows without keys: m = -inf, LSE = +inf. For each way to make P.
TEST(BwdGpu, RowMaxIsTheIntegerReference) {
  SKIP_WITHOUT_GPU();
  for (Recipe r : {Recipe::kNvfp4Fast, Recipe::kFp4Direct, Recipe::kFp8}) {
    const Problem pb{1, 300, 140, 2, 2, 128, true, r};  // rows 0..159 have no key (bottom-right)
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + pb.name());
    std::mt19937_64 rng(seed);
    Inputs in = make_inputs(pb, rng);
    Grads g;
    ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, false, &g).ok());
    int64_t bad = 0;
    for (int64_t h = 0; h < pb.h; ++h) {
      for (int64_t i = 0; i < pb.s_q; ++i) {
        const float m = in.row_max[h * pb.s_q + i], lse = in.lse[h * pb.s_q + i];
        const int64_t visible = std::max<int64_t>(0, i - (pb.s_q - pb.s_k) + 1);
        if (visible == 0) {
          bad += !(m == -INFINITY && lse == INFINITY);
          continue;
        }
        const double l = std::exp2(double(lse) * 1.4426950408889634 - m + 8);
        bad += !(m == std::floor(m) && l > 128 * (1 - 1e-5) && l <= 256 * visible * (1 + 1e-5));
      }
    }
    EXPECT_EQ(bad, 0) << "rows whose row_max is not their integer reference";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BwdGpuShapes, ::testing::ValuesIn(shapes()),
                         [](const ::testing::TestParamInfo<Problem>& i) { return i.param.name(); });

// nvfp4 on N(0, 1) inputs at s = 256: the issue's accuracy target against the float64 backward
// of the same recipe (its forward semantics, exact arithmetic).
TEST(BwdGpu, Nvfp4CosineVsFloat64) {
  SKIP_WITHOUT_GPU();
  for (bool causal : {false, true}) {
    const Problem pb{1, 256, 256, 4, 2, 128, causal, Recipe::kNvfp4};
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + pb.name());
    std::mt19937_64 rng(seed);
    Inputs in = make_inputs(pb, rng);
    Grads g;
    const Status st = run_gpu(pb, &in, DType::kF32, false, &g);
    ASSERT_TRUE(st.ok()) << st.message();
    const GoldenGrads ref = run_golden(pb, in, BackwardArithmetic::kFloat64);
    const char* names[3] = {"dq", "dk", "dv"};
    const std::vector<float>* got[3] = {&g.dq, &g.dk, &g.dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    for (int i = 0; i < 3; ++i) {
      const ErrorStats s = stats(*got[i], *want[i]);
      EXPECT_GE(s.cos, kMinCosVsF64) << names[i] << " vs float64: " << to_string(s);
      std::printf("nvfp4 %s %s vs float64: %s\n", causal ? "causal" : "full", names[i],
                  to_string(s).c_str());
    }
  }
}

// Deterministic mode: two runs bit-identical; the default mode within FP32 reordering of it.
TEST(BwdGpu, DeterministicRunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const Problem pb{1, 300, 300, 4, 2, 128, true, Recipe::kNvfp4};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Inputs in = make_inputs(pb, rng);
  Grads a, b, c;
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, true, &a).ok());
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, true, &b).ok());
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, false, &c).ok());
  EXPECT_EQ(0, std::memcmp(a.dq.data(), b.dq.data(), a.dq.size() * 4)) << "dq differs";
  EXPECT_EQ(0, std::memcmp(a.dk.data(), b.dk.data(), a.dk.size() * 4)) << "dk differs";
  EXPECT_EQ(0, std::memcmp(a.dv.data(), b.dv.data(), a.dv.size() * 4)) << "dv differs";
  // dK/dV never use atomics: identical in both modes. dQ: the same sums in another order.
  EXPECT_EQ(0, std::memcmp(a.dk.data(), c.dk.data(), a.dk.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.dv.data(), c.dv.data(), a.dv.size() * 4));
  const std::vector<double> ref(a.dq.begin(), a.dq.end());
  EXPECT_LE(stats(c.dq, ref).rel_l2, 1e-5);
}

// O, dO and dQ with a head stride of d + 2 elements (even: the forward stores O in pairs): rows
// that are not 16-byte aligned take the preprocess's scalar loads and dq_convert's scalar stores
// instead of the vector ones. In deterministic mode the arithmetic is the same: the gradients must
// be bit-identical to the contiguous run's.
TEST(BwdGpu, UnalignedRowsMatchContiguous) {
  SKIP_WITHOUT_GPU();
  for (const DType gt : {DType::kF32, DType::kBF16}) {
    const Problem pb{2, 130, 200, 4, 2, 64, true, Recipe::kNvfp4};
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    Inputs in = make_inputs(pb, rng);
    Grads ref;
    ASSERT_TRUE(run_gpu(pb, &in, gt, true, &ref).ok());
    // The same problem, with o / dout / dq rows at head stride d + 2.
    const int64_t hs = pb.d + 2, ss = pb.h * hs, bs = pb.s_q * ss, n = pb.b * bs;
    const size_t es = gt == DType::kF32 ? 4 : 2;
    DeviceArray<uint16_t> q(in.q.size()), k(in.k.size()), v(in.v.size()), o(n), dout(n);
    DeviceArray<float> lse(pb.b * pb.h * pb.s_q);
    DeviceArray<uint8_t> dq(n * es), dk(pb.nk() * es), dv(pb.nk() * es);
    q.upload(in.q);
    k.upload(in.k);
    v.upload(in.v);
    std::vector<uint16_t> dpad(n, 0);
    for (int64_t x = 0; x < pb.nq(); ++x) dpad[x / pb.d * hs + x % pb.d] = in.dout[x];
    dout.upload(dpad);
    ForwardOptions opt;
    opt.recipe = pb.recipe;
    opt.causal = pb.causal;
    auto padded = [&](void* ptr, DType t) {
      return make_strided_view(ptr, t, {pb.b, pb.s_q, pb.h, pb.d}, {bs, ss, hs, 1});
    };
    const TensorView tq = make_view(q.ptr, DType::kBF16, {pb.b, pb.s_q, pb.h, pb.d});
    const TensorView tk = make_view(k.ptr, DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d});
    const TensorView tv = make_view(v.ptr, DType::kBF16, {pb.b, pb.s_k, pb.h_kv, pb.d});
    const TensorView tl = make_view(lse.ptr, DType::kF32, {pb.b, pb.h, pb.s_q});
    ASSERT_TRUE(
        attention_forward_cuda(tq, tk, tv, opt, padded(o.ptr, DType::kBF16), tl, nullptr).ok());
    BackwardCudaOptions bopt;
    bopt.deterministic = true;
    ASSERT_TRUE(attention_backward_cuda(tq, tk, tv, opt, padded(o.ptr, DType::kBF16), tl,
                                        padded(dout.ptr, DType::kBF16), padded(dq.ptr, gt),
                                        make_view(dk.ptr, gt, {pb.b, pb.s_k, pb.h_kv, pb.d}),
                                        make_view(dv.ptr, gt, {pb.b, pb.s_k, pb.h_kv, pb.d}), bopt,
                                        nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> dq_pad = dq.download(), dk_b = dk.download(), dv_b = dv.download();
    std::vector<uint8_t> dq_b(pb.nq() * es);
    for (int64_t x = 0; x < pb.nq(); ++x) {
      std::memcpy(&dq_b[x * es], &dq_pad[(x / pb.d * hs + x % pb.d) * es], es);
    }
    const bool f32 = gt == DType::kF32;
    const void* want[3] = {f32 ? (const void*)ref.dq.data() : ref.dq16.data(),
                           f32 ? (const void*)ref.dk.data() : ref.dk16.data(),
                           f32 ? (const void*)ref.dv.data() : ref.dv16.data()};
    EXPECT_EQ(0, std::memcmp(dq_b.data(), want[0], dq_b.size())) << "dq differs";
    EXPECT_EQ(0, std::memcmp(dk_b.data(), want[1], dk_b.size())) << "dk differs";
    EXPECT_EQ(0, std::memcmp(dv_b.data(), want[2], dv_b.size())) << "dv differs";
  }
}

// BF16 gradients are the RNE of the F32 ones (the same kernels, another store).
TEST(BwdGpu, Bf16GradientsAreRoundedF32) {
  SKIP_WITHOUT_GPU();
  const Problem pb{1, 77, 150, 2, 1, 64, true, Recipe::kFp8};
  std::mt19937_64 rng(fresh_seed());
  Inputs in = make_inputs(pb, rng);
  Grads f, h;
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, true, &f).ok());
  ASSERT_TRUE(run_gpu(pb, &in, DType::kBF16, true, &h).ok());
  const std::vector<float>* f32[3] = {&f.dq, &f.dk, &f.dv};
  const std::vector<uint16_t>* b16[3] = {&h.dq16, &h.dk16, &h.dv16};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(f32[i]->size(), b16[i]->size());
    int64_t diff = 0;
    for (size_t j = 0; j < b16[i]->size(); ++j)
      diff += float_to_bf16_bits((*f32[i])[j]) != (*b16[i])[j];
    EXPECT_EQ(diff, 0) << "gradient " << i;
  }
}

// ---- DSource::kHighPrecisionO: D_hp = sum_j p_ij dP_ij from the D_hp pass ----------------------

// Against the golden model's emulated high-precision-o (the same D_hp definition, float64 sums):
// the tolerances of the default D. Causal and not, GQA / MQA, odd lengths, rows without keys.
class BwdGpuHighPrecisionO : public ::testing::TestWithParam<Problem> {};

TEST_P(BwdGpuHighPrecisionO, MatchesEmulatedGolden) {
  SKIP_WITHOUT_GPU();
  const Problem pb = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " " + pb.name());
  std::mt19937_64 rng(seed);
  Inputs in = make_inputs(pb, rng);
  Grads g;
  const Status st = run_gpu(pb, &in, DType::kF32, false, &g, DSource::kHighPrecisionO);
  ASSERT_TRUE(st.ok()) << st.message();
  const GoldenGrads ref =
      run_golden(pb, in, BackwardArithmetic::kEmulatedFp8, DSource::kHighPrecisionO);
  expect_close("dq", g.dq, ref.dq);
  expect_close("dk", g.dk, ref.dk);
  expect_close("dv", g.dv, ref.dv);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BwdGpuHighPrecisionO,
                         ::testing::Values(Problem{1, 17, 333, 4, 2, 64, true, Recipe::kFp8},
                                           Problem{1, 333, 17, 4, 1, 128, true, Recipe::kNvfp4},
                                           Problem{1, 65, 190, 4, 2, 64, false, Recipe::kNvfp4},
                                           Problem{2, 200, 300, 4, 2, 128, true, Recipe::kMxfp4}),
                         [](const ::testing::TestParamInfo<Problem>& i) { return i.param.name(); });

// ||sum_j dK_j|| / ||dK|| (sum over keys per batch, kv head and channel): the gradient of a key
// bias, which softmax ignores. BackwardEmulatedKeyBias (tests/reference/
// test_golden_backward_emulated.cc) measured the golden model on this problem: with FP8 dS the
// floor is dS's E4M3 rounding noise (high-precision-o 0.024-0.029), forward-o adds its D mismatch
// (0.048-0.061). The GPU rounds dS the same way (its FP32 sums move the share by far less).
double key_bias_share(const Problem& pb, const std::vector<float>& dk) {
  double num = 0, den = 0;
  for (int64_t b = 0; b < pb.b; ++b) {
    for (int64_t hk = 0; hk < pb.h_kv; ++hk) {
      for (int64_t c = 0; c < pb.d; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < pb.s_k; ++j) {
          const double x = dk[((b * pb.s_k + j) * pb.h_kv + hk) * pb.d + c];
          sum += x;
          den += x * x;
        }
        num += sum * sum;
      }
    }
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// The golden model's bounds (kMaxKeyBiasShareHighPrecisionO, kMinKeyBiasShareForwardO): ~5
// standard deviations from either population's mean over seeds.
constexpr double kGpuMaxKeyBiasShareHp = 0.035;
constexpr double kGpuMinKeyBiasShareForwardO = 0.04;

TEST(BwdGpu, HighPrecisionOLeavesAKeyBiasNoGradient) {
  SKIP_WITHOUT_GPU();
  for (Recipe r : {Recipe::kFp8, Recipe::kNvfp4}) {
    for (bool det : {false, true}) {
      const Problem pb{1, 256, 256, 4, 4, 64, true, r};
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " " + pb.name() +
                   (det ? " deterministic" : ""));
      std::mt19937_64 rng(seed);
      Inputs in = make_inputs(pb, rng);
      in.q = random_bf16(pb.nq(), rng, 3.f);  // sharper rows, as late in training
      Grads fwd, hp;
      ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, det, &fwd).ok());
      ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, det, &hp, DSource::kHighPrecisionO).ok());
      const double s_fwd = key_bias_share(pb, fwd.dk), s_hp = key_bias_share(pb, hp.dk);
      std::printf("%s%s key-bias share: forward-o %.3e, high-precision-o %.3e\n", pb.name().c_str(),
                  det ? " det" : "", s_fwd, s_hp);
      EXPECT_GT(s_fwd, kGpuMinKeyBiasShareForwardO);
      EXPECT_LT(s_hp, kGpuMaxKeyBiasShareHp);
      const GoldenGrads ref =
          run_golden(pb, in, BackwardArithmetic::kEmulatedFp8, DSource::kHighPrecisionO);
      expect_close("dq", hp.dq, ref.dq);
      expect_close("dk", hp.dk, ref.dk);
      expect_close("dv", hp.dv, ref.dv);
    }
  }
}

// Deterministic high-precision-o: D_hp's adds take the dQ turns (key-block order), so runs are
// bit-identical; the default mode's D_hp differs in its last bits only (FP32 atomics), which may
// flip a few E4M3 roundings of dS: within the golden bound of the deterministic run.
TEST(BwdGpu, HighPrecisionODeterministicRunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const Problem pb{1, 300, 300, 4, 2, 128, true, Recipe::kNvfp4};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Inputs in = make_inputs(pb, rng);
  Grads a, b, c;
  const DSource hp = DSource::kHighPrecisionO;
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, true, &a, hp).ok());
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, true, &b, hp).ok());
  ASSERT_TRUE(run_gpu(pb, &in, DType::kF32, false, &c, hp).ok());
  EXPECT_EQ(0, std::memcmp(a.dq.data(), b.dq.data(), a.dq.size() * 4)) << "dq differs";
  EXPECT_EQ(0, std::memcmp(a.dk.data(), b.dk.data(), a.dk.size() * 4)) << "dk differs";
  EXPECT_EQ(0, std::memcmp(a.dv.data(), b.dv.data(), a.dv.size() * 4)) << "dv differs";
  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<float>* det[3] = {&a.dq, &a.dk, &a.dv};
  const std::vector<float>* any[3] = {&c.dq, &c.dk, &c.dv};
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> ref(det[i]->begin(), det[i]->end());
    EXPECT_LE(stats(*any[i], ref).rel_l2, kMaxRelL2VsGolden) << names[i];
  }
}

// Bad input: a Status naming the argument, nothing launched (no CUDA call is made, so this also
// runs on machines without a GPU).
TEST(BwdGpu, BadInputBeforeLaunch) {
  const int64_t b = 1, s = 64, h = 2, d = 64;
  std::vector<uint16_t> host(b * s * h * d);
  std::vector<float> g(b * s * h * d), lse(b * h * s);
  const TensorView x = make_view(host.data(), DType::kBF16, {b, s, h, d});
  const TensorView gr = make_view(g.data(), DType::kF32, {b, s, h, d});
  const TensorView tl = make_view(lse.data(), DType::kF32, {b, h, s});
  ForwardOptions opt;
  opt.recipe = Recipe::kBf16;  // no engine forward, so no GPU backward
  Status st = attention_backward_cuda(x, x, x, opt, x, tl, x, gr, gr, gr, {}, nullptr);
  EXPECT_TRUE(st.unsupported()) << st.message();
  // nvfp4-fast: the forward's row_max is required, of lse's shape.
  opt.recipe = Recipe::kNvfp4Fast;
  st = attention_backward_cuda(x, x, x, opt, x, tl, x, gr, gr, gr, {}, nullptr);
  EXPECT_NE(st.message().find("row_max: required for 'nvfp4-fast'"), std::string::npos)
      << st.message();
  st = attention_backward_cuda(x, x, x, opt, x, tl, x, gr, gr, gr, {}, nullptr, gr);
  EXPECT_NE(st.message().find("row_max"), std::string::npos) << st.message();
  opt.recipe = Recipe::kNvfp4;
  st = attention_backward_cuda(x, x, x, opt, x, TensorView{}, x, gr, gr, gr, {}, nullptr);
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st.message();
  const TensorView bad = make_view(g.data(), DType::kF32, {b, s, h, 32});
  st = attention_backward_cuda(x, x, x, opt, x, tl, x, bad, gr, gr, {}, nullptr);
  EXPECT_NE(st.message().find("dq"), std::string::npos) << st.message();
  // d_source: a known value.
  BackwardCudaOptions bad_d;
  bad_d.d_source = static_cast<DSource>(5);
  st = attention_backward_cuda(x, x, x, opt, x, tl, x, gr, gr, gr, bad_d, nullptr);
  EXPECT_NE(st.message().find("d_source: unknown"), std::string::npos) << st.message();
  ForwardOperands ops;  // undefined operands
  st = attention_backward_operands_cuda(ops, opt, x, tl, x, gr, gr, gr, {}, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("q_data"), std::string::npos) << st.message();
  if (testing::have_gpu()) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace fp4attn
