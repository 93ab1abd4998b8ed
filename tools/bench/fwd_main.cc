// Command line of `fp4attn_bench fwd` (docs/benchmarks.md, "fwd").
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fwd_suite.h"
#include "options.h"
#include "suites.h"

#ifndef FP4ATTN_BENCH_REVISION
#define FP4ATTN_BENCH_REVISION "unknown"
#endif

namespace fp4attn::bench {
namespace {

void fwd_usage(FILE* f) {
  std::fprintf(f,
               "usage: fp4attn_bench fwd [options]   (also: fp4attn_bench --suite fwd ...)\n"
               "  --out FILE, --json FILE  JSON output (default fwd.json)\n"
               "  --recipes LIST     recipes to time, e.g. fp8,nvfp4 (default fp8)\n"
               "  --quick            d=128, s in {4k, 16k}: 4 points, shorter timing\n"
               "  --dims LIST        head dims instead of 64,128\n"
               "  --seqlens LIST     sequence lengths instead of 1024,...,16384\n"
               "  --warmup N         warm-up calls (default 3)\n"
               "  --reps N           at least N timed calls per point (default 10)\n"
               "  --min-time-ms T    and at least T ms of timed calls (default 200; quick 50)\n"
               "  --sample-rows N    query rows checked against float64 per point (default 256)\n"
               "  --acc-slices N     (batch, head) slices of the FA3-shape check, 0 = all 128\n"
               "                     (default 32)\n"
               "  --no-fa3           skip the FA3-shape accuracy record\n"
               "  --seed N           input seed (default 0)\n"
               "  --revision SHA     git revision recorded in the JSON\n"
               "  --device N         CUDA device (default 0)\n"
               "  --list             print the grid and exit\n");
}

bool parse_int(const std::string& s, long long lo, long long* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo) return false;
  *out = v;
  return true;
}

bool parse_list(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    long long v = 0;
    if (!parse_int(s.substr(start, comma == std::string::npos ? comma : comma - start), 1, &v)) {
      return false;
    }
    out->push_back(v);
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

bool parse_recipes(const std::string& s, std::vector<Recipe>* out) {
  out->clear();
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    Recipe r;
    if (!parse_recipe(s.substr(start, comma == std::string::npos ? comma : comma - start), &r)) {
      return false;
    }
    out->push_back(r);
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

}  // namespace

int fwd_main(int argc, char** argv, const std::string& command) {
  FwdOptions opt;
  opt.out_path = "fwd.json";
  opt.revision = FP4ATTN_BENCH_REVISION;
  opt.command = command;
  bool reps_given = false, time_given = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    std::string key, value;
    const bool has_value = split_option(a, &key, &value);
    auto next = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fp4attn_bench: %s needs a value\n", key.c_str());
        return false;
      }
      value = argv[++i];
      return true;
    };
    auto bad = [&]() {
      std::fprintf(stderr, "fp4attn_bench: bad %s '%s'\n", key.c_str(), value.c_str());
      return 2;
    };
    long long v = 0;
    if (key == "--help" || key == "-h") {
      fwd_usage(stdout);
      return 0;
    } else if (key == "--quick") {
      opt.quick = true;
    } else if (key == "--list") {
      opt.list = true;
    } else if (key == "--no-fa3") {
      opt.fa3_accuracy = false;
    } else if (key == "--out" || key == "--json") {
      if (!next()) return 2;
      opt.out_path = value;
    } else if (key == "--revision") {
      if (!next()) return 2;
      opt.revision = value;
    } else if (key == "--recipes" || key == "--recipe") {
      if (!next()) return 2;
      if (!parse_recipes(value, &opt.recipes)) return bad();
    } else if (key == "--dims") {
      if (!next()) return 2;
      if (!parse_list(value, &opt.dims)) return bad();
    } else if (key == "--seqlens") {
      if (!next()) return 2;
      if (!parse_list(value, &opt.seqlens)) return bad();
    } else if (key == "--min-time-ms") {
      if (!next()) return 2;
      char* end = nullptr;
      opt.min_time_ms = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(opt.min_time_ms >= 0)) return bad();
      time_given = true;
    } else if (key == "--warmup" || key == "--reps" || key == "--sample-rows" ||
               key == "--acc-slices" || key == "--seed" || key == "--device") {
      if (!next()) return 2;
      if (!parse_int(value, key == "--reps" ? 1 : 0, &v)) return bad();
      if (key == "--warmup") opt.timing.warmup = static_cast<int>(v);
      if (key == "--reps") opt.min_reps = static_cast<int>(v), reps_given = true;
      if (key == "--sample-rows") opt.sample_rows = static_cast<int>(v);
      if (key == "--acc-slices") opt.acc_slices = static_cast<int>(v);
      if (key == "--seed") opt.seed = static_cast<uint64_t>(v);
      if (key == "--device") opt.device = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "fp4attn_bench: unknown fwd option '%s'\n", a.c_str());
      fwd_usage(stderr);
      return 2;
    }
  }
  for (const int64_t d : opt.dims) {
    if (d != 64 && d != 128) {
      std::fprintf(stderr, "fp4attn_bench: --dims takes 64 and 128\n");
      return 2;
    }
  }
  if (opt.recipes.empty()) return 2;
  if (opt.quick) {
    if (!time_given) opt.min_time_ms = 50;
    if (!reps_given) opt.min_reps = 10;
  }
  return run_fwd_suite(opt);
}

}  // namespace fp4attn::bench
