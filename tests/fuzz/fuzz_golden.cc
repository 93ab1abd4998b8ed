// libFuzzer target: the golden forward (include/fp4attn/golden/golden.h) on tiny problems.
// Input: [shape and flags: 3][recipe][poison: kind, batch, token, head, channel][softmax scale]
// then BF16 values (one byte each in narrow mode, two bytes of BF16 bits in wide mode; what the
// input lacks is filled from a generator seeded by the header). b <= 2, h_kv <= 2, h = h_kv or
// 2 h_kv, s_q, s_k <= 8, d 64 or 128, causal or not, every recipe, both emulations.
// Invariants (docs/numerics.md sections 1 and 4, the NaN rule of tests/reference/
// test_nan_rule.cc), a trap when broken:
//  * a row with no visible key gets O = 0 and LSE = +inf, whatever the rest of the input holds;
//  * finite inputs give finite O and LSE on every row that sees a key;
//  * a NaN (or, for the quantized recipes, an Inf) in q reaches its row's LSE and every channel;
//    in k, every row of its query heads that reads the key; in v (NaN or -inf), the poisoned
//    channel of every row that reads the key, also where that key's P is exactly 0; for bf16
//    (per-element operands) exactly those rows or channels, every other value stays finite;
//  * the operands path (quantize_operand_host, then golden_attention_forward_operands) equals the
//    direct path bit for bit (golden.h; test_package_api.py's
//    test_quantized_path_is_bit_identical_on_cpu), for the default (folded E4M3) emulation.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "fp4attn/golden/golden.h"
#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/tensor.h"
#include "fuzz/fuzz_check.h"

namespace fp4attn {
namespace {

enum Poison { kNone, kNanQ, kNanK, kNanV, kInfQ, kInfK, kNegInfV, kPoisonKinds };

struct Problem {
  int64_t b, h, h_kv, s_q, s_k, d;
  bool causal;
  RecipeOptions opt;
  int poison;
  int64_t pb, pt, ph, pc;         // poisoned batch, token, head (q head or kv head), channel
  std::vector<uint16_t> q, k, v;  // BF16 bits, BSHD
};

struct Result {
  std::vector<double> o, lse;
};

// Reads the fuzz input; once it runs out, a 64-bit LCG seeded by the header takes over.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  bool done() const { return n == 0; }
  uint8_t byte() {
    if (n) {
      state = state * 31 + *p;
      return --n, *p++;
    }
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(state >> 56);
  }
};

uint16_t bf16(float x) { return float_to_bf16_bits(x); }

// Narrow: int8 / 16, |x| <= 8, a realistic attention range. Wide: any finite BF16.
uint16_t value(Reader& in, bool wide) {
  if (!wide) return bf16(static_cast<float>(static_cast<int8_t>(in.byte())) / 16.f);
  const uint16_t bits = static_cast<uint16_t>(in.byte() | in.byte() << 8);
  return std::isfinite(bf16_bits_to_float(bits)) ? bits : 0;
}

Problem make_problem(const uint8_t* data, size_t size) {
  Reader in{data, size};
  Problem p;
  const uint8_t f0 = in.byte(), f1 = in.byte(), f2 = in.byte();
  p.b = 1 + (f0 & 1);
  p.h_kv = 1 + ((f0 >> 1) & 1);
  p.h = p.h_kv * (1 + ((f0 >> 2) & 1));
  p.causal = (f0 >> 3) & 1;
  p.d = (f0 >> 4) & 1 ? 128 : 64;
  const bool exact = (f0 >> 5) & 1, wide = (f0 >> 6) & 1;
  p.s_q = f1 % 9;
  p.s_k = f2 % 9;
  p.opt.recipe = kAllRecipes[in.byte() % 8];
  p.opt.causal = p.causal;
  p.opt.emulation = exact ? Emulation::kBlockScaledExact : Emulation::kFoldedE4M3;
  p.poison = in.byte() % (kPoisonKinds + 2);  // a few more "none"
  if (p.poison >= kPoisonKinds) p.poison = kNone;
  p.pb = in.byte() % p.b;
  p.pt = in.byte();
  p.ph = in.byte();
  p.pc = in.byte() % p.d;
  const uint8_t scale = in.byte();
  p.opt.softmax_scale = (f0 >> 7) ? 0 : scale / 32.0;  // 0: 1/sqrt(d)
  p.q.resize(p.b * p.s_q * p.h * p.d);
  p.k.resize(p.b * p.s_k * p.h_kv * p.d);
  p.v.resize(p.k.size());
  for (auto* t : {&p.q, &p.k, &p.v}) {
    for (uint16_t& x : *t) x = value(in, wide);
  }
  // The bf16 recipe is IEEE arithmetic on the values: an Inf in q or k is a +-inf logit (or a
  // NaN from 0 * inf), as float64 gives it, not a poisoned block: not this target's rule,
  // so no Inf is written.
  if (p.opt.recipe == Recipe::kBf16 && (p.poison == kInfQ || p.poison == kInfK)) p.poison = kNone;
  const bool on_q = p.poison == kNanQ || p.poison == kInfQ;
  const int64_t s = on_q ? p.s_q : p.s_k, heads = on_q ? p.h : p.h_kv;
  if (p.poison != kNone && s > 0) {
    p.pt %= s;
    p.ph %= heads;
    std::vector<uint16_t>& t = on_q ? p.q : (p.poison == kNanK || p.poison == kInfK ? p.k : p.v);
    const float bad = p.poison == kNegInfV ? -INFINITY
                                           : (p.poison == kInfQ || p.poison == kInfK
                                                  ? INFINITY
                                                  : std::numeric_limits<float>::quiet_NaN());
    t[((p.pb * s + p.pt) * heads + p.ph) * p.d + p.pc] = bf16(bad);
  } else {
    p.poison = kNone;
  }
  return p;
}

Result run_direct(Problem& p) {
  Result r{std::vector<double>(p.b * p.s_q * p.h * p.d, -1.0),
           std::vector<double>(p.b * p.h * p.s_q, -1.0)};
  const Status st =
      golden_attention_forward(make_view(p.q.data(), DType::kBF16, {p.b, p.s_q, p.h, p.d}),
                               make_view(p.k.data(), DType::kBF16, {p.b, p.s_k, p.h_kv, p.d}),
                               make_view(p.v.data(), DType::kBF16, {p.b, p.s_k, p.h_kv, p.d}),
                               p.opt, make_view(r.o.data(), DType::kF64, {p.b, p.s_q, p.h, p.d}),
                               make_view(r.lse.data(), DType::kF64, {p.b, p.h, p.s_q}));
  FUZZ_CHECK(st.ok());  // every problem here is valid
  return r;
}

// quantize_operand_host of q, k and v, then attention over the operands (test_nan_rule.cc's
// GoldenOverOperandsFollowsFloat64 builds them the same way).
Result run_operands(Problem& p) {
  const Recipe r = p.opt.recipe;
  const DType code = operand_data_dtype(r, OperandRole::kQ);
  const DType v_code = operand_data_dtype(r, OperandRole::kV);
  const int64_t width = dtype_size(code), pitch = operand_v_pitch(p.s_k);
  const int64_t tq = operand_scale_tiles(p.s_q), tk = operand_scale_tiles(p.s_k);
  std::vector<uint8_t> qd(p.b * p.h * p.s_q * p.d * width), kd(p.b * p.h_kv * p.s_k * p.d * width),
      vd(p.b * p.h_kv * p.d * pitch * width, 0xEE);
  std::vector<float> qs(p.b * p.h * tq), ks(p.b * p.h_kv * tk), vs(p.b * p.h_kv * p.d);
  ForwardOperands in;
  in.q_data = make_view(qd.data(), code, {p.b, p.h, p.s_q, p.d});
  in.k_data = make_view(kd.data(), code, {p.b, p.h_kv, p.s_k, p.d});
  in.v_data = make_view(vd.data(), v_code, {p.b, p.h_kv, p.d, pitch});
  in.q_scale = make_view(qs.data(), DType::kF32, {p.b, p.h, tq});
  in.k_scale = make_view(ks.data(), DType::kF32, {p.b, p.h_kv, tk});
  in.v_scale = make_view(vs.data(), DType::kF32, {p.b, p.h_kv, p.d});
  const struct {
    std::vector<uint16_t>* x;
    int64_t s, heads;
    OperandRole role;
    TensorView data, scale;
  } roles[] = {{&p.q, p.s_q, p.h, OperandRole::kQ, in.q_data, in.q_scale},
               {&p.k, p.s_k, p.h_kv, OperandRole::kK, in.k_data, in.k_scale},
               {&p.v, p.s_k, p.h_kv, OperandRole::kV, in.v_data, in.v_scale}};
  for (const auto& x : roles) {
    const Status st =
        quantize_operand_host(make_view(x.x->data(), DType::kBF16, {p.b, x.s, x.heads, p.d}), r,
                              x.role, OperandOptions{}, x.data, x.scale, TensorView{});
    FUZZ_CHECK(st.ok());
  }
  Result res{std::vector<double>(p.b * p.s_q * p.h * p.d, -1.0),
             std::vector<double>(p.b * p.h * p.s_q, -1.0)};
  RecipeOptions opt = p.opt;
  const Status st = golden_attention_forward_operands(
      in, opt, make_view(res.o.data(), DType::kF64, {p.b, p.s_q, p.h, p.d}),
      make_view(res.lse.data(), DType::kF64, {p.b, p.h, p.s_q}));
  FUZZ_CHECK(st.ok());
  return res;
}

bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y;
}

// Keys row i sees: bottom-right aligned causal mask (numerics.md section 1).
int64_t visible_keys(const Problem& p, int64_t i) {
  if (!p.causal) return p.s_k;
  return std::min(std::max<int64_t>(i + p.s_k - p.s_q + 1, 0), p.s_k);
}

void check_invariants(const Problem& p, const Result& r) {
  const int64_t group = p.h / p.h_kv;
  const bool bf16_recipe = p.opt.recipe == Recipe::kBf16;
  for (int64_t b = 0; b < p.b; ++b) {
    for (int64_t h = 0; h < p.h; ++h) {
      for (int64_t i = 0; i < p.s_q; ++i) {
        const double lse = r.lse[(b * p.h + h) * p.s_q + i];
        const double* o = &r.o[((b * p.s_q + i) * p.h + h) * p.d];
        const int64_t n = visible_keys(p, i);
        if (n == 0) {  // no visible key: O = 0, LSE = +inf, poison or not
          FUZZ_CHECK(lse == std::numeric_limits<double>::infinity());
          for (int64_t c = 0; c < p.d; ++c) FUZZ_CHECK(o[c] == 0.0);
          continue;
        }
        // Which of this row's values the poison must reach (row: LSE and every channel).
        const bool in_batch = p.poison != kNone && b == p.pb;
        bool row = false, channel = false;
        switch (p.poison) {
          case kNanQ:
          case kInfQ:
            row = in_batch && h == p.ph && i == p.pt;
            break;
          case kNanK:
          case kInfK:
            row = in_batch && h / group == p.ph && p.pt < n;
            break;
          case kNanV:
          case kNegInfV:
            channel = in_batch && h / group == p.ph && p.pt < n;
            break;
          default:
            break;
        }
        if (row) {
          FUZZ_CHECK(std::isnan(lse));
          for (int64_t c = 0; c < p.d; ++c) FUZZ_CHECK(std::isnan(o[c]));
        }
        if (channel) FUZZ_CHECK(!std::isfinite(o[p.pc]));
        // Unpoisoned values stay finite: everywhere without poison, and for bf16 (whose operands
        // are per element, no shared block scale) everywhere the poison does not reach.
        if (p.poison == kNone || (bf16_recipe && !row)) {
          FUZZ_CHECK(std::isfinite(lse));
          for (int64_t c = 0; c < p.d; ++c) {
            if (!(channel && c == p.pc)) FUZZ_CHECK(std::isfinite(o[c]));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace fp4attn

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread: the problems are tiny, and a thread per head per input would dominate.
  setenv("FP4ATTN_NUM_THREADS", "1", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fp4attn;
  Problem p = make_problem(data, size);
  if (std::getenv("FUZZ_VERBOSE")) {  // to read a reproducer: FUZZ_VERBOSE=1 fuzz_golden FILE
    std::fprintf(stderr,
                 "b %ld h %ld h_kv %ld s_q %ld s_k %ld d %ld causal %d recipe %s exact %d scale %g"
                 " poison %d at (%ld, %ld, %ld, %ld)\n",
                 long(p.b), long(p.h), long(p.h_kv), long(p.s_q), long(p.s_k), long(p.d), p.causal,
                 recipe_name(p.opt.recipe), p.opt.emulation == Emulation::kBlockScaledExact,
                 p.opt.softmax_scale, p.poison, long(p.pb), long(p.pt), long(p.ph), long(p.pc));
  }
  const Result direct = run_direct(p);
  if (std::getenv("FUZZ_VERBOSE")) {
    for (double x : direct.lse) std::fprintf(stderr, "%g ", x);
    std::fprintf(stderr, "(LSE)\n");
  }
  check_invariants(p, direct);
  if (p.opt.emulation == Emulation::kFoldedE4M3) {
    const Result ops = run_operands(p);
    for (size_t i = 0; i < direct.o.size(); ++i) FUZZ_CHECK(same(ops.o[i], direct.o[i]));
    for (size_t i = 0; i < direct.lse.size(); ++i) FUZZ_CHECK(same(ops.lse[i], direct.lse[i]));
  }
  return 0;
}
