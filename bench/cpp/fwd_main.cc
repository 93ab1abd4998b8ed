// Command line of `fp4attn_bench fwd` (docs/benchmarks.md, "fwd").
#include <string>
#include <vector>

#include "fwd_suite.h"
#include "suite_args.h"
#include "suites.h"

namespace fp4attn::bench {

int fwd_main(const std::vector<std::string>& argv, const std::string& command) {
  const std::vector<FlagSpec> flags = suite_flags(
      {
          {"recipes", true, "recipes to time, e.g. fp8,nvfp4", "fp8"},
          {"quick", false, "d=128, s in {4k, 16k}: 4 points, shorter timing", ""},
          {"dims", true, "head dims instead of the grid's", "64,128"},
          {"seqlens", true, "sequence lengths instead of the grid's", "1024,...,16384"},
          {"warmup", true, "warm-up calls", "3"},
          {"reps", true, "at least this many timed calls per point", "10"},
          {"min-time-ms", true, "and at least this long in timed calls", "200; quick 50"},
          {"sample-rows", true, "query rows checked against float64 per point", "256"},
          {"acc-slices", true, "(batch, head) slices of the FA3-shape check, 0 = all 128", "32"},
          {"no-fa3", false, "skip the FA3-shape accuracy record", ""},
          {"seed", true, "input seed", "0"},
          {"list", false, "print the grid and exit", ""},
          {"bound", false, "time the no-softmax bound (constant P, wrong results; fp8 only)", ""},
      },
      "fwd.json");
  const Args a(argv, flags);
  if (print_help(a,
                 "usage: fp4attn_bench fwd [flags]\n\nTimes the forward engine on issue 4's "
                 "grid, with its accuracy against float64.",
                 flags)) {
    return 0;
  }
  FwdOptions opt;
  read_suite_flags(a, "fwd.json", command, &opt);
  opt.recipes = recipe_list(a, "fp8");
  opt.quick = a.has("quick");
  if (a.has("dims")) opt.dims = a.get_int_list("dims", "", 64, 128);
  for (const int64_t d : opt.dims) {
    if (d != 64 && d != 128) throw UsageError("--dims: takes 64 and 128, got " + std::to_string(d));
  }
  if (a.has("seqlens")) opt.seqlens = a.get_int_list("seqlens", "", 1, int64_t{1} << 24);
  opt.timing.warmup = static_cast<int>(a.get_int("warmup", 3, 0, 1000));
  opt.min_reps = static_cast<int>(a.get_int("reps", 10, 1, 100000));
  opt.min_time_ms = a.get_double("min-time-ms", opt.quick ? 50 : 200, 0, 1e6);
  opt.sample_rows = static_cast<int>(a.get_int("sample-rows", 256, 0, 1 << 20));
  opt.acc_slices = static_cast<int>(a.get_int("acc-slices", 32, 0, 1 << 20));
  opt.fa3_accuracy = !a.has("no-fa3");
  opt.seed = static_cast<uint64_t>(a.get_int("seed", 0, 0, INT64_MAX));
  opt.list = a.has("list");
  opt.bound = a.has("bound");
  if (opt.bound && (opt.recipes.size() != 1 || opt.recipes[0] != Recipe::kFp8)) {
    throw UsageError("--bound: times the fp8 recipe's kernel only (--recipes fp8)");
  }
  return run_fwd_suite(opt);
}

}  // namespace fp4attn::bench
