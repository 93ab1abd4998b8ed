#include "fwd_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "record.h"

namespace fp4attn::bench {
namespace {

// "[a, b]"
std::string int_pair(int64_t a, int64_t b) {
  return json_array({std::to_string(a), std::to_string(b)});
}

JsonObject& shape_json(JsonObject& o, const FwdPoint& p) {
  return o.integer("b", p.b)
      .integer("h", p.h)
      .integer("h_kv", p.h_kv)
      .integer("s_q", p.s_q)
      .integer("s_k", p.s_k)
      .integer("d", p.d)
      .boolean("causal", p.causal);
}

std::string record_json(const FwdRecord& r) {
  JsonObject o;
  o.str("case", r.p.name()).str("recipe", recipe_name(r.recipe));
  shape_json(o, r.p);
  if (!r.error.empty()) return o.str("error", r.error).render();
  const double quant = r.quant_ms[0] + r.quant_ms[1] + r.quant_ms[2];
  o.num("ms", r.t.median_ms, 5)
      .num("ms_min", r.t.min_ms, 5)
      .num("ms_max", r.t.max_ms, 5)
      .integer("reps", r.t.samples)
      .num("tflops", r.p.flops() / r.t.median_ms / 1e9, 5)
      .num("quant_ms", quant, 4)
      .num("quant_q_ms", r.quant_ms[0], 4)
      .num("quant_k_ms", r.quant_ms[1], 4)
      .num("quant_v_ms", r.quant_ms[2], 4)
      .num("cos", r.acc.cos, 8)
      .num("rel_l2", r.acc.rel_l2, 5)
      .num("max_abs", r.acc.max_abs, 4)
      .integer("nan_mismatch", r.acc.nan_mismatch)
      .integer("acc_rows", r.acc_rows)
      .raw("acc_slice", int_pair(r.acc_batch, r.acc_head))
      .num("sm_mhz", r.sm_mhz, 5);
  return o.render();
}

std::string accuracy_json(const AccuracyRecord& a, int64_t total_slices) {
  JsonObject o;
  o.str("case", fa3_case(a.p)).str("recipe", recipe_name(a.recipe));
  shape_json(o, a.p);
  if (!a.error.empty()) return o.str("error", a.error).render();
  std::vector<std::string> slices;
  for (const auto& [batch, head] : a.slices) slices.push_back(int_pair(batch, head));
  o.num("ms", a.t.median_ms, 5)
      .num("tflops", a.p.flops() / a.t.median_ms / 1e9, 5)
      .num("cos", a.acc.cos, 8)
      .num("rel_l2", a.acc.rel_l2, 5)
      .num("max_abs", a.acc.max_abs, 4)
      .integer("nan_mismatch", a.acc.nan_mismatch)
      .num("worst_slice_cos", a.worst_cos, 8)
      .num("worst_slice_rel_l2", a.worst_rel_l2, 5)
      .integer("slices_compared", static_cast<long long>(a.slices.size()))
      .integer("slices_total", total_slices)
      .raw("slices", json_array(slices))
      .str("reference", "float64 reference_attention_forward, every row of each compared slice")
      .raw("fa3_fp8", JsonObject().num("cos", 0.9986).num("rel_l2", 0.053).render());
  return o.render();
}

// The SM clocks measured after each point's timed loop, sorted.
std::vector<double> loaded_clocks(const FwdRun& s) {
  std::vector<double> mhz;
  for (const auto& r : s.records) {
    if (r.error.empty() && r.sm_mhz > 0) mhz.push_back(r.sm_mhz);
  }
  std::sort(mhz.begin(), mhz.end());
  return mhz;
}

}  // namespace

std::string fa3_case(const FwdPoint& p) {
  std::string n = "fa3-";
  n += p.name();
  return n;
}

double median_clock(const FwdRun& s) {
  const std::vector<double> mhz = loaded_clocks(s);
  return mhz.empty() ? std::nan("") : mhz[mhz.size() / 2];
}

bool write_json(const FwdRun& s) {
  const FwdOptions& opt = *s.opt;
  const std::vector<double> mhz = loaded_clocks(s);
  const double median_mhz = median_clock(s);
  std::string recipes;
  for (const Recipe r : opt.recipes) {
    if (!recipes.empty()) recipes += ',';
    recipes += recipe_name(r);
  }
  std::vector<std::string> recs, accs;
  for (const auto& r : s.records) recs.push_back(record_json(r));
  const FwdPoint fa3 = fa3_accuracy_point();
  for (const auto& a : s.accuracy) accs.push_back(accuracy_json(a, fa3.b * fa3.h));

  JsonObject doc = record_header("fwd", true, opt, s.dev.name, s.date);
  doc.boolean("complete", s.complete)
      .raw("ceilings", JsonObject()
                           .num("copy_tbps", s.copy.tbps, 4)
                           .num("copy_memcpy_tbps", s.copy.memcpy_tbps, 4)
                           .num("copy_kernel_tbps", s.copy.kernel_tbps, 4)
                           .integer("copy_bytes", s.copy.bytes)
                           .render())
      .num("sm_clock_mhz", median_mhz, 5)
      .num("sm_clock_min_mhz", mhz.empty() ? std::nan("") : mhz.front(), 5)
      .num("sm_clock_peak_mhz", s.peak_mhz, 5)
      .raw("clocks", JsonObject()
                         .raw("before", clocks_json(s.before).render())
                         .raw("after", clocks_json(s.after).render())
                         .render())
      .raw("config",
           JsonObject()
               .integer("sms", s.dev.sms)
               .integer("l2_bytes", static_cast<long long>(s.dev.l2_bytes))
               .str("recipes", recipes)
               .integer("warmup", opt.timing.warmup)
               .integer("min_reps", opt.min_reps)
               .num("min_time_ms", opt.min_time_ms)
               .integer("sample_rows", opt.sample_rows)
               .integer("seed", static_cast<long long>(opt.seed))
               .str("inputs", "q, k, v N(0, 1) BF16 BSHD (Box-Muller on the GPU), seeded per point")
               .str("timing",
                    "CUDA events around each call, median; no L2 rotation (each point's operands "
                    "and output, >= 160 MB, exceed the L2); no LSE output")
               .render())
      .raw("records", json_array_lines(recs))
      .raw("accuracy", json_array_lines(accs));
  return write_record(opt, doc);
}

void print_record(const FwdRecord& r) {
  if (!r.error.empty()) {
    std::printf("%-22s %-10s error: %s\n", r.p.name().c_str(), recipe_name(r.recipe),
                r.error.c_str());
  } else {
    std::printf("%-22s %-10s %9.4f %8.1f %8.4f %10.7f %8.5f %6.0f\n", r.p.name().c_str(),
                recipe_name(r.recipe), r.t.median_ms, r.p.flops() / r.t.median_ms / 1e9,
                r.quant_ms[0] + r.quant_ms[1] + r.quant_ms[2], r.acc.cos, r.acc.rel_l2, r.sm_mhz);
  }
  std::fflush(stdout);
}

void print_header() {
  std::printf("%-22s %-10s %9s %8s %8s %10s %8s %6s\n", "case", "recipe", "ms", "TFLOP/s",
              "quant ms", "cos", "rel_l2", "MHz");
}

}  // namespace fp4attn::bench
