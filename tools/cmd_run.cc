// `fp4attn run`: seeded inputs from the standard suite, the best available backend, accuracy
// against float64 (and against the recipe's golden model when the backend is not the golden).
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
#include "fp4attn/golden/reference.h"
#include "gpu/run_gpu.h"
#include "harness/metrics.h"
#include "harness/suite.h"
#include "json_writer.h"

namespace fp4attn::cli {
namespace {

const std::vector<FlagSpec> kRunFlags = {
    {"batch", true, "batch size", "1"},
    {"heads", true, "query heads", "4"},
    {"kv-heads", true, "key/value heads (GQA when fewer than --heads)", "--heads"},
    {"seqlen-q", true, "query tokens per sequence", "1024"},
    {"seqlen-k", true, "key tokens per sequence", "--seqlen-q"},
    {"head-dim", true, "64 or 128", "128"},
    {"causal", false, "causal mask aligned bottom-right (FlashAttention's convention)", ""},
    {"recipe", true, "a recipe name (fp4attn recipes) or 'all'", "all"},
    {"input", true, "gaussian, outliers, large-logits, near-uniform or 'all'", "gaussian"},
    {"seed", true, "input seed", "0"},
    {"softmax-scale", true, "softmax scale", "1/sqrt(head-dim)"},
    {"smooth-k", false, "subtract the key mean per head before quantizing K", ""},
    {"emulation", true, "'folded' (Hopper, E4M3 operands) or 'exact' (Blackwell block-scaled)",
     "folded"},
    {"backend", true,
     "'auto' (the GPU engine where it runs the recipe, else the golden model), 'gpu' or 'cpu'",
     "auto"},
    json_flag(),
    quiet_flag(),
    {"help", false, "show this help", ""},
};

// The backend column of a row that ran on the GPU (the golden model's: "cpu-golden").
constexpr const char* kGpuBackend = "gpu-sm90";

struct Problem {
  int64_t b, h, h_kv, s_q, s_k, d;
  bool causal;
  double softmax_scale;
};

struct Row {
  std::string recipe, input, backend;
  ErrorStats vs_f64;
  double lse_max_err;  // max |LSE - LSE_f64| over rows with keys
  double p_zero_pct;
  double ms;
};

Problem parse_problem(const Args& a) {
  Problem p{};
  p.b = a.get_int("batch", 1, 0, 1 << 20);
  p.h = a.get_int("heads", 4, 1, 4096);
  p.h_kv = a.get_int("kv-heads", p.h, 1, 4096);
  // int32's range: the golden model counts a block's tokens in int (fp8 V's channel blocks).
  p.s_q = a.get_int("seqlen-q", 1024, 0, INT32_MAX);
  p.s_k = a.get_int("seqlen-k", p.s_q, 0, INT32_MAX);
  p.d = a.get_int("head-dim", 128, 1, 4096);
  p.causal = a.has("causal");
  p.softmax_scale = a.get_double("softmax-scale", 0);
  if (p.d != 64 && p.d != 128) {
    throw UsageError("--head-dim: expected 64 or 128, got " + std::to_string(p.d));
  }
  if (p.h % p.h_kv != 0) {
    throw UsageError("--heads: " + std::to_string(p.h) + " is not a multiple of --kv-heads " +
                     std::to_string(p.h_kv));
  }
  if (a.has("softmax-scale") && !(p.softmax_scale > 0)) {
    throw UsageError("--softmax-scale: expected a value > 0, got " + a.get("softmax-scale", ""));
  }
  // Every buffer below is sized from these flags: refuse products that overflow or do not fit
  // in memory before allocating (a wrapped size was written past, issue 26).
  const int64_t nq = flag_product(
      "q elements",
      {{"--batch", p.b}, {"--seqlen-q", p.s_q}, {"--heads", p.h}, {"--head-dim", p.d}});
  const int64_t nk = flag_product(
      "k elements",
      {{"--batch", p.b}, {"--seqlen-k", p.s_k}, {"--kv-heads", p.h_kv}, {"--head-dim", p.d}});
  const int64_t nlse =
      flag_product("lse elements", {{"--batch", p.b}, {"--heads", p.h}, {"--seqlen-q", p.s_q}});
  // The suite's q, k, v (float32); o and the reference's o, their LSEs (float64); per thread,
  // the golden model's operands of one head (float32 copies, float64 values).
  check_host_buffers("--batch, --heads, --kv-heads, --seqlen-q, --seqlen-k, --head-dim",
                     {{nq, 4},
                      {nk, 8},
                      {nq, 16},
                      {nlse, 16},
                      {(p.s_q + 2 * p.s_k) * p.d, 12 * int64_t(num_threads())}});
  return p;
}

double lse_max_err(const std::vector<double>& lse, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref[i]) && lse[i] == ref[i]) continue;  // rows without keys: +inf both
    m = std::max(m, std::fabs(lse[i] - ref[i]));
  }
  return m;
}

void print_row(const Row& r) {
  if (r.vs_f64.n == 0) {  // an empty problem: nothing was compared
    std::printf("%-11s %-13s %-11s %8s %8s %8s %9s %9s %9s %7s %9.1f\n", r.recipe.c_str(),
                r.input.c_str(), r.backend.c_str(), "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                r.ms);
    return;
  }
  std::printf("%-11s %-13s %-11s %8.5f %8.4f %8.4f %9.3e %9.3e %9.2e %7.2f %9.1f\n",
              r.recipe.c_str(), r.input.c_str(), r.backend.c_str(), r.vs_f64.cos, r.vs_f64.rel_l2,
              r.vs_f64.rel_l1, r.vs_f64.rmse, r.vs_f64.max_abs, r.lse_max_err, r.p_zero_pct, r.ms);
}

void write_json(const Args& a, const std::vector<std::string>& argv, const Problem& p,
                const std::vector<Row>& rows) {
  std::vector<std::string> records;
  RanOn ran;
  for (const Row& r0 : rows) {
    (r0.backend == kGpuBackend ? ran.gpu : ran.cpu) = true;
    Row r = r0;
    if (r.vs_f64.n == 0) {  // empty: no metric (null), not a perfect one
      r.vs_f64.cos = r.vs_f64.rel_l2 = r.vs_f64.rel_l1 = r.vs_f64.rmse = r.vs_f64.max_abs = NAN;
      r.lse_max_err = r.p_zero_pct = NAN;
    }
    JsonObject j;
    j.str("recipe", r.recipe).str("input", r.input).str("backend", r.backend);
    j.integer("b", p.b).integer("h", p.h).integer("h_kv", p.h_kv).integer("s_q", p.s_q);
    j.integer("s_k", p.s_k).integer("d", p.d).boolean("causal", p.causal);
    j.num("cos", r.vs_f64.cos, 7).num("rel_l2", r.vs_f64.rel_l2, 7);
    j.num("rel_l1", r.vs_f64.rel_l1, 7).num("rmse", r.vs_f64.rmse, 7);
    j.num("max_abs", r.vs_f64.max_abs, 7).num("lse_max_err", r.lse_max_err, 7);
    j.num("p_zero_pct", r.p_zero_pct, 7);  // NaN (null): the GPU backend does not count it
    j.integer("nan_mismatch", r.vs_f64.nan_mismatch);
    j.integer("inf_mismatch", r.vs_f64.inf_mismatch).num("ms", r.ms, 6);
    records.push_back(j.render());
  }
  JsonObject doc = cli_document("accuracy", "run", argv, ran);
  write_cli_json(a, doc.raw("records", json_array_lines(records)));
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  const Args a(argv, kRunFlags);
  if (a.has("help")) {
    std::printf("%s", format_help("usage: fp4attn run [flags]\n\nRuns attention on seeded inputs "
                                  "and prints its accuracy against float64: one row per input "
                                  "and recipe, each announced on stderr as [i/N] (--quiet: "
                                  "not).",
                                  kRunFlags)
                          .c_str());
    return 0;
  }
  const Problem p = parse_problem(a);
  const std::vector<Recipe> recipes = parse_recipes(a);
  const std::vector<InputKind> inputs = parse_input_kinds(a);
  const auto seed = static_cast<uint64_t>(a.get_int("seed", 0, 0, INT64_MAX));
  const std::string emu = a.get("emulation", "folded");
  if (emu != "folded" && emu != "exact") {
    throw UsageError("--emulation: expected folded or exact, got '" + emu + "'");
  }
  const std::string backend = a.get("backend", "auto");
  if (backend != "auto" && backend != "cpu" && backend != "gpu") {
    throw UsageError("--backend: expected auto, gpu or cpu, got '" + backend + "'");
  }
  // Per recipe: the GPU engine when asked for (or, with auto, when it can run the recipe here).
  auto use_gpu = [&](Recipe r) {
    if (backend == "cpu") return false;
    const std::string why = gpu_unavailable_reason(r);
    if (backend == "gpu" && !why.empty()) throw UsageError("--backend gpu: " + why);
    return why.empty();
  };
  for (Recipe r : recipes) (void)use_gpu(r);  // reject --backend gpu before any work
  check_json_path(a);

  std::printf("fp4attn run: b=%lld h=%lld h_kv=%lld s_q=%lld s_k=%lld d=%lld %s, seed %llu\n",
              (long long)p.b, (long long)p.h, (long long)p.h_kv, (long long)p.s_q, (long long)p.s_k,
              (long long)p.d, p.causal ? "causal" : "non-causal", (unsigned long long)seed);
  const std::string gpu_note = gpu_unavailable_reason(Recipe::kFp8);
  std::printf(
      "backends: gpu-sm90 = the Hopper engine (BF16 in/out, time = quantization + kernel)"
      "%s; cpu-golden = the golden model that defines each recipe\n",
      gpu_note.empty() ? "" : (" - unavailable: " + gpu_note).c_str());
  std::printf("errors against float64 attention of the same inputs\n\n");
  std::printf("%-11s %-13s %-11s %8s %8s %8s %9s %9s %9s %7s %9s\n", "recipe", "input", "backend",
              "cos", "rel_l2", "rel_l1", "rmse", "max_abs", "lse_err", "p_zero%", "ms");

  std::vector<Row> rows;
  Progress progress = cli_progress(a, static_cast<int64_t>(inputs.size() * recipes.size()));
  for (InputKind kind : inputs) {
    SuiteInputs in = make_inputs(kind, p.b, p.s_q, p.s_k, p.h, p.h_kv, p.d, seed);
    TensorView q = make_view(in.q.data(), DType::kF32, {p.b, p.s_q, p.h, p.d});
    TensorView k = make_view(in.k.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d});
    TensorView v = make_view(in.v.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d});
    std::vector<double> o_ref(p.b * p.s_q * p.h * p.d), lse_ref(p.b * p.h * p.s_q);
    TensorView o_ref_v = make_view(o_ref.data(), DType::kF64, {p.b, p.s_q, p.h, p.d});
    TensorView lse_ref_v = make_view(lse_ref.data(), DType::kF64, {p.b, p.h, p.s_q});
    AttentionOptions ref_opt{p.softmax_scale, p.causal};
    Status st = reference_attention_forward(q, k, v, ref_opt, o_ref_v, lse_ref_v);
    if (!st.ok()) throw UsageError(st.message());

    for (Recipe r : recipes) {
      progress.next(std::string("input ") + input_kind_name(kind) + ", recipe " + recipe_name(r));
      RecipeOptions opt;
      opt.recipe = r;
      opt.softmax_scale = p.softmax_scale;
      opt.causal = p.causal;
      opt.smooth_k = a.has("smooth-k");
      opt.emulation = emu == "exact" ? Emulation::kBlockScaledExact : Emulation::kFoldedE4M3;
      std::vector<double> o(o_ref.size()), lse(lse_ref.size());
      RecipeStats stats;
      const TensorView o_v = make_view(o.data(), DType::kF64, {p.b, p.s_q, p.h, p.d});
      const TensorView lse_v = make_view(lse.data(), DType::kF64, {p.b, p.h, p.s_q});
      const bool gpu = use_gpu(r) && !opt.smooth_k && emu == "folded";
      double ms = 0;
      if (gpu) {
        st = run_attention_gpu(q, k, v, r, p.causal, p.softmax_scale, o_v, lse_v, &ms);
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        st = golden_attention_forward(q, k, v, opt, o_v, lse_v, &stats);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count();
      }
      if (!st.ok()) throw UsageError(st.message());
      Row row{recipe_name(r),
              input_kind_name(kind),
              gpu ? kGpuBackend : "cpu-golden",
              compare(o.data(), o_ref.data(), static_cast<int64_t>(o.size())),
              lse_max_err(lse, lse_ref),
              gpu                ? NAN
              : stats.p_elements ? 100.0 * stats.p_zero / stats.p_elements
                                 : 0.0,
              ms};
      print_row(row);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (a.has("json")) write_json(a, argv, p, rows);
  return 0;
}

}  // namespace fp4attn::cli
