// `fp4attn emulation`: what Hopper's scale folding costs against the Blackwell kernels'
// block-scaled arithmetic, measured on the golden model: each recipe with Emulation::kFoldedE4M3
// and Emulation::kBlockScaledExact, the two outputs against each other and against float64
// (the numbers of the Blackwell-difference table in docs/numerics.md).
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
#include "fp4attn/golden/reference.h"
#include "harness/metrics.h"
#include "harness/suite.h"
#include "json_writer.h"

namespace fp4attn::cli {
namespace {

const std::vector<FlagSpec> kEmulationFlags = with_suite_shape_flags({
    {"recipe", true, "a recipe name or 'fp4' (nvfp4, nvfp4-hx, mxfp4, nvfp4-all, fp4-direct)",
     "fp4"},
    {"input", true, "gaussian, outliers, large-logits, near-uniform or 'all'", "gaussian"},
    {"seed", true, "input seed", "0"},
    json_flag(),
    quiet_flag(),
    {"help", false, "show this help", ""},
});

// The recipes with a Blackwell block-scaled counterpart (nvfp4-fast shares nvfp4's operands).
constexpr Recipe kFp4Recipes[] = {Recipe::kNvfp4, Recipe::kNvfp4Hx, Recipe::kMxfp4,
                                  Recipe::kNvfp4All, Recipe::kFp4Direct};

struct Row {
  std::string recipe, input;
  ErrorStats folded_vs_exact, folded_vs_f64, exact_vs_f64;
};

std::vector<double> golden(SuiteInputs& in, Recipe r, Emulation emu, bool causal) {
  RecipeOptions opt;
  opt.recipe = r;
  opt.causal = causal;
  opt.emulation = emu;
  std::vector<double> o(in.b * in.s_q * in.h * in.d);
  const Status st = golden_attention_forward(
      make_view(in.q.data(), DType::kF32, {in.b, in.s_q, in.h, in.d}),
      make_view(in.k.data(), DType::kF32, {in.b, in.s_k, in.h_kv, in.d}),
      make_view(in.v.data(), DType::kF32, {in.b, in.s_k, in.h_kv, in.d}), opt,
      make_view(o.data(), DType::kF64, {in.b, in.s_q, in.h, in.d}), TensorView{});
  if (!st.ok()) throw UsageError(st.message());
  return o;
}

JsonObject json_stats(const ErrorStats& e) {
  return JsonObject().num("cos", e.cos, 7).num("rel_l2", e.rel_l2, 7).num("max_abs", e.max_abs, 7);
}

}  // namespace

int cmd_emulation(const std::vector<std::string>& argv) {
  const Args a(argv, kEmulationFlags);
  if (a.has("help")) {
    std::printf("%s", format_help("usage: fp4attn emulation [flags]\n\nCompares the golden "
                                  "model's Hopper arithmetic (block scales folded into E4M3) "
                                  "with the Blackwell block-scaled arithmetic (exact scales), "
                                  "per recipe, and both with float64: one row per input and "
                                  "recipe, each announced on stderr as [i/N] (--quiet: not).",
                                  kEmulationFlags)
                          .c_str());
    return 0;
  }
  const auto [b, h, s, d, causal, seed] = parse_suite_shape(a);
  std::vector<Recipe> recipes(std::begin(kFp4Recipes), std::end(kFp4Recipes));
  if (const std::string name = a.get("recipe", "fp4"); name != "fp4") {
    recipes.assign(1, Recipe::kNvfp4);
    if (!parse_recipe(name, &recipes[0])) {
      throw UsageError("--recipe: unknown recipe '" + name + "' (see fp4attn recipes)");
    }
  }
  const std::vector<InputKind> inputs = parse_input_kinds(a);
  // Checked before any allocation: q, k, v (float32), the reference and the two golden outputs
  // (float64); per thread, one head's operands.
  check_host_buffers("--batch, --heads, --seqlen, --head-dim",
                     {{b * s * h * d, 12 + 24}, {3 * s * d, 12 * int64_t(num_threads())}});
  check_json_path(a);

  std::printf("fp4attn emulation: b=%lld h=%lld s=%lld d=%lld %s, seed %llu\n", (long long)b,
              (long long)h, (long long)s, (long long)d, causal ? "causal" : "non-causal",
              (unsigned long long)seed);
  std::printf("folded = Hopper (E4M3 operands), exact = Blackwell block-scaled products\n\n");
  std::printf("%-11s %-13s %12s %12s %9s %9s %9s %9s\n", "recipe", "input", "fold-vs-exact",
              "fold-max-abs", "fold-cos", "fold-rl2", "exact-cos", "exact-rl2");
  std::vector<Row> rows;
  Progress progress = cli_progress(a, static_cast<int64_t>(inputs.size() * recipes.size()));
  for (InputKind kind : inputs) {
    SuiteInputs in = make_inputs(kind, b, s, s, h, h, d, seed);
    std::vector<double> ref(b * s * h * d);
    const Status st =
        reference_attention_forward(make_view(in.q.data(), DType::kF32, {b, s, h, d}),
                                    make_view(in.k.data(), DType::kF32, {b, s, h, d}),
                                    make_view(in.v.data(), DType::kF32, {b, s, h, d}), {0, causal},
                                    make_view(ref.data(), DType::kF64, {b, s, h, d}), TensorView{});
    if (!st.ok()) throw UsageError(st.message());
    for (Recipe r : recipes) {
      progress.next(std::string("input ") + input_kind_name(kind) + ", recipe " + recipe_name(r));
      const std::vector<double> f = golden(in, r, Emulation::kFoldedE4M3, causal);
      const std::vector<double> x = golden(in, r, Emulation::kBlockScaledExact, causal);
      const auto n = static_cast<int64_t>(ref.size());
      Row row{recipe_name(r), input_kind_name(kind), compare(f.data(), x.data(), n),
              compare(f.data(), ref.data(), n), compare(x.data(), ref.data(), n)};
      if (n == 0) {  // an empty problem: nothing was compared
        std::printf("%-11s %-13s %12s %12s %9s %9s %9s %9s\n", row.recipe.c_str(),
                    row.input.c_str(), "n/a", "n/a", "n/a", "n/a", "n/a", "n/a");
        for (ErrorStats* e : {&row.folded_vs_exact, &row.folded_vs_f64, &row.exact_vs_f64}) {
          e->cos = e->rel_l2 = e->max_abs = NAN;  // null in the JSON, not a perfect score
        }
        rows.push_back(row);
        continue;
      }
      std::printf("%-11s %-13s %12.4e %12.4e %9.5f %9.5f %9.5f %9.5f\n", row.recipe.c_str(),
                  row.input.c_str(), row.folded_vs_exact.rel_l2, row.folded_vs_exact.max_abs,
                  row.folded_vs_f64.cos, row.folded_vs_f64.rel_l2, row.exact_vs_f64.cos,
                  row.exact_vs_f64.rel_l2);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (a.has("json")) {
    std::vector<std::string> records;
    for (const Row& r : rows) {
      JsonObject j;
      j.str("recipe", r.recipe).str("input", r.input);
      j.integer("b", b).integer("h", h).integer("s", s).integer("d", d).boolean("causal", causal);
      j.obj("folded_vs_exact", json_stats(r.folded_vs_exact));
      j.obj("folded_vs_f64", json_stats(r.folded_vs_f64));
      j.obj("exact_vs_f64", json_stats(r.exact_vs_f64));
      records.push_back(j.render());
    }
    // The golden model only: CPU.
    JsonObject doc = cli_document("emulation", "emulation", argv, RanOn{.cpu = true});
    write_cli_json(a, doc.raw("records", json_array_lines(records)));
  }
  return 0;
}

}  // namespace fp4attn::cli
