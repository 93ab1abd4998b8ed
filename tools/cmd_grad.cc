// `fp4attn grad`: the backward's gradient accuracy on the standard suite (issue 8). Per recipe and
// input: the recipe's golden forward (O, LSE), a seeded upstream gradient dO, the golden backward
// (by default with the GPU's FP8 operand numerics, BackwardArithmetic::kEmulatedFp8), and dQ, dK,
// dV against the float64 gradients of exact attention of the unquantized inputs.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_inputs.h"
#include "cli_output.h"
#include "commands.h"
#include "core/parallel.h"
#include "fp4attn/golden/golden.h"
#include "fp4attn/golden/golden_backward.h"
#include "fp4attn/golden/reference.h"
#include "harness/metrics.h"
#include "harness/suite.h"
#include "json_writer.h"

namespace fp4attn::cli {
namespace {

const std::vector<FlagSpec> kGradFlags = with_suite_shape_flags({
    {"recipe", true, "a recipe name (fp4attn recipes) or 'all'", "all"},
    {"input", true, "gaussian, outliers, large-logits, near-uniform or 'all'", "gaussian"},
    {"seed", true, "input seed; dO uses the same seed (see --help)", "0"},
    {"d-source", true, "D of the backward: 'forward-o' (the forward's O) or 'high-precision-o'",
     "forward-o"},
    {"smooth-k", false, "K smoothing (the recipe's K minus its mean per head, numerics.md §3)", ""},
    {"ds-scales", true,
     "dS's power-of-two scales (fp8 arithmetic): 'per-tile' (the GPU kernel's) or 'per-head' "
     "(one per (batch, head) slice)",
     "per-tile"},
    {"arithmetic", true,
     "the golden backward's GEMMs: 'fp8' (the GPU's FP8 operands) or 'f64' (float64)", "fp8"},
    json_flag(),
    quiet_flag(),
    {"help", false, "show this help", ""},
});

constexpr const char* kGradUsage =
    "usage: fp4attn grad [flags]\n\n"
    "Gradient accuracy of the golden backward: per recipe and suite input, dQ, dK, dV of the\n"
    "recipe's golden forward and backward against the float64 gradients of exact attention of\n"
    "the unquantized inputs (cos, rel_l2). dO ~ N(0, 1): element i (flat BSHD index) is\n"
    "suite_normal(--seed, stream 101, i) (fp4attn/suite.h), the same for every recipe and\n"
    "input. A recipe the backward refuses for the chosen arithmetic is printed as refused.\n"
    "Each input and recipe is announced on stderr as [i/N] (--quiet: not).";

struct GradRow {
  std::string recipe, input, refused;  // refused: the backward's message, empty when it ran
  ErrorStats dq, dk, dv;
  double ms = 0;
};

// dO ~ N(0, 1) from the suite's generator, on a stream of its own (platform independent).
constexpr uint64_t kDoutStream = 101;
std::vector<double> make_dout(int64_t n, uint64_t seed) {
  std::vector<double> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = suite_normal(seed, kDoutStream, static_cast<uint64_t>(i));
  return x;
}

JsonObject json_stats(const ErrorStats& e) {
  return JsonObject().num("cos", e.cos, 7).num("rel_l2", e.rel_l2, 7);
}

}  // namespace

int cmd_grad(const std::vector<std::string>& argv) {
  const Args a(argv, kGradFlags);
  if (a.has("help")) {
    std::printf("%s", format_help(kGradUsage, kGradFlags).c_str());
    return 0;
  }
  const auto [b, h, s, d, causal, seed] = parse_suite_shape(a);
  const bool smooth_k = a.has("smooth-k");
  const std::vector<Recipe> recipes = parse_recipes(a);
  const std::vector<InputKind> inputs = parse_input_kinds(a);
  BackwardOptions bopt;
  const std::string d_source = a.get("d-source", "forward-o");
  if (d_source != "forward-o" && d_source != "high-precision-o") {
    throw UsageError("--d-source: expected forward-o or high-precision-o, got '" + d_source + "'");
  }
  bopt.d_source = d_source == "forward-o" ? DSource::kForwardO : DSource::kHighPrecisionO;
  const std::string arith = a.get("arithmetic", "fp8");
  if (arith != "fp8" && arith != "f64") {
    throw UsageError("--arithmetic: expected fp8 or f64, got '" + arith + "'");
  }
  bopt.arithmetic =
      arith == "fp8" ? BackwardArithmetic::kEmulatedFp8 : BackwardArithmetic::kFloat64;
  const std::string ds_scales = a.get("ds-scales", "per-tile");
  if (ds_scales != "per-head" && ds_scales != "per-tile") {
    throw UsageError("--ds-scales: expected per-head or per-tile, got '" + ds_scales + "'");
  }
  bopt.ds_scales = ds_scales == "per-tile" ? DsScales::kPerTile : DsScales::kPerHead;
  // dS scales exist only in the FP8 arithmetic: float64 has none to place (golden_backward.h).
  if (a.has("ds-scales") && bopt.arithmetic == BackwardArithmetic::kFloat64) {
    throw UsageError("--ds-scales: applies to --arithmetic fp8 only (float64 dS has no scales)");
  }
  // Checked before any allocation: q, k, v (float32), dO and the reference's dq, dk, dv, the
  // golden's o, dq, dk, dv and per-head dK, dV partials (float64), the LSE; per thread, one
  // head's P, dP, dS and dS's two scaled copies ([s, s] float64).
  const int64_t elems = b * s * h * d;  // checked by parse_suite_shape
  const int64_t scores = flag_product("scores per head", {{"--seqlen", s}, {"--seqlen", s}});
  check_host_buffers(
      "--batch, --heads, --seqlen, --head-dim",
      {{elems, 12}, {elems, 8 * 10}, {b * h * s, 8}, {scores, 40 * int64_t(num_threads())}});
  check_json_path(a);

  std::printf("fp4attn grad: b=%lld h=%lld s=%lld d=%lld %s%s, seed %llu, d-source %s, %s%s\n",
              (long long)b, (long long)h, (long long)s, (long long)d,
              causal ? "causal" : "non-causal", smooth_k ? ", smooth-k" : "",
              (unsigned long long)seed, d_source.c_str(),
              arith == "fp8" ? "emulated FP8 backward (the GPU's operands)" : "float64 backward",
              arith == "f64"            ? ""
              : ds_scales == "per-tile" ? ", dS scales per tile"
                                        : ", dS scales per head");
  std::printf("golden forward + backward of each recipe against float64 exact attention\n\n");
  std::printf("%-11s %-13s %9s %9s %9s %9s %9s %9s %9s\n", "recipe", "input", "dq-cos", "dq-rl2",
              "dk-cos", "dk-rl2", "dv-cos", "dv-rl2", "ms");

  const auto t_all = std::chrono::steady_clock::now();
  const int64_t nq = b * s * h * d, nlse = b * h * s;
  std::vector<double> dout = make_dout(nq, seed);
  const TensorView dout_v = make_view(dout.data(), DType::kF64, {b, s, h, d});
  std::vector<GradRow> rows;
  Progress progress = cli_progress(a, static_cast<int64_t>(inputs.size() * recipes.size()));
  for (InputKind kind : inputs) {
    SuiteInputs in = make_inputs(kind, b, s, s, h, h, d, seed);
    const TensorView q = make_view(in.q.data(), DType::kF32, {b, s, h, d});
    const TensorView k = make_view(in.k.data(), DType::kF32, {b, s, h, d});
    const TensorView v = make_view(in.v.data(), DType::kF32, {b, s, h, d});
    std::vector<double> rq(nq), rk(nq), rv(nq);
    Status st = reference_attention_backward(q, k, v, dout_v, {0, causal},
                                             make_view(rq.data(), DType::kF64, {b, s, h, d}),
                                             make_view(rk.data(), DType::kF64, {b, s, h, d}),
                                             make_view(rv.data(), DType::kF64, {b, s, h, d}));
    if (!st.ok()) throw UsageError(st.message());

    for (Recipe r : recipes) {
      progress.next(std::string("input ") + input_kind_name(kind) + ", recipe " + recipe_name(r));
      GradRow row{recipe_name(r), input_kind_name(kind), "", {}, {}, {}, 0};
      RecipeOptions opt;
      opt.recipe = r;
      opt.causal = causal;
      opt.smooth_k = smooth_k;
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<double> o(nq), lse(nlse), gq(nq), gk(nq), gv(nq);
      const TensorView o_v = make_view(o.data(), DType::kF64, {b, s, h, d});
      st = golden_attention_forward(q, k, v, opt, o_v,
                                    make_view(lse.data(), DType::kF64, {b, h, s}));
      if (!st.ok()) throw UsageError(st.message());
      st = golden_attention_backward(q, k, v, o_v, dout_v,
                                     make_view(lse.data(), DType::kF64, {b, h, s}), opt,
                                     make_view(gq.data(), DType::kF64, {b, s, h, d}),
                                     make_view(gk.data(), DType::kF64, {b, s, h, d}),
                                     make_view(gv.data(), DType::kF64, {b, s, h, d}), bopt);
      row.ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok()) {
        row.refused = st.message();
        std::printf("%-11s %-13s refused: %s\n", row.recipe.c_str(), row.input.c_str(),
                    row.refused.c_str());
      } else if (nq == 0) {  // an empty problem: nothing to compare
        std::printf("%-11s %-13s %9s %9s %9s %9s %9s %9s %9.1f\n", row.recipe.c_str(),
                    row.input.c_str(), "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", row.ms);
      } else {
        row.dq = compare(gq.data(), rq.data(), nq);
        row.dk = compare(gk.data(), rk.data(), nq);
        row.dv = compare(gv.data(), rv.data(), nq);
        std::printf("%-11s %-13s %9.5f %9.5f %9.5f %9.5f %9.5f %9.5f %9.1f\n", row.recipe.c_str(),
                    row.input.c_str(), row.dq.cos, row.dq.rel_l2, row.dk.cos, row.dk.rel_l2,
                    row.dv.cos, row.dv.rel_l2, row.ms);
      }
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
  std::printf("\ntotal %.1f s\n", total_s);

  if (a.has("json")) {
    std::vector<std::string> records;
    for (const GradRow& r : rows) {
      JsonObject j;
      j.str("recipe", r.recipe).str("input", r.input).boolean("causal", causal);
      j.boolean("smooth_k", smooth_k);
      if (!r.refused.empty()) {
        j.str("refused", r.refused);
      } else if (r.dq.n == 0) {  // empty: no metric (null), not a perfect one
        const ErrorStats none{0, NAN, NAN, NAN, NAN, NAN, 0, 0};
        j.obj("dq", json_stats(none)).obj("dk", json_stats(none)).obj("dv", json_stats(none));
      } else {
        j.obj("dq", json_stats(r.dq)).obj("dk", json_stats(r.dk)).obj("dv", json_stats(r.dv));
      }
      records.push_back(j.render());
    }
    // The golden model only: CPU.
    JsonObject doc = cli_document("grad-accuracy", "grad", argv, RanOn{.cpu = true});
    doc.integer("seed", static_cast<long long>(seed));
    doc.str("dout", "N(0,1): suite_normal(seed, stream 101, flat BSHD index)");
    doc.obj("shape", JsonObject().integer("b", b).integer("h", h).integer("s", s).integer("d", d));
    doc.str("d_source", d_source).str("arithmetic", arith).str("ds_scales", ds_scales);
    doc.num("seconds", total_s, 4).raw("records", json_array_lines(records));
    write_cli_json(a, doc);
  }
  return 0;
}

}  // namespace fp4attn::cli
