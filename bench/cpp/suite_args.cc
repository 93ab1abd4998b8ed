#include "suite_args.h"

#include <cstdio>
#include <utility>

#ifndef FP4ATTN_BENCH_REVISION
#define FP4ATTN_BENCH_REVISION "unknown"
#endif

namespace fp4attn::bench {

std::vector<FlagSpec> suite_flags(std::vector<FlagSpec> own, const std::string& default_out) {
  std::vector<FlagSpec> all = std::move(own);
  all.insert(all.end(), {
                            {"out", true, "JSON output", default_out},
                            {"json", true, "the same as --out", ""},
                            {"revision", true, "git revision recorded in the JSON",
                             FP4ATTN_BENCH_REVISION " (configure time)"},
                            {"device", true, "CUDA device", "0"},
                            {"help", false, "show this help", ""},
                        });
  return all;
}

void read_suite_flags(const Args& a, const std::string& default_out, const std::string& command,
                      SuiteOptions* opt) {
  opt->out_path = a.get("out", a.get("json", default_out));
  opt->revision = a.get("revision", FP4ATTN_BENCH_REVISION);
  opt->device = static_cast<int>(a.get_int("device", 0, 0, 1023));
  opt->command = command;
}

bool print_help(const Args& a, const std::string& usage, const std::vector<FlagSpec>& flags) {
  if (!a.has("help")) return false;
  std::printf("%s", cli::format_help(usage, flags).c_str());
  return true;
}

std::vector<Recipe> recipe_list(const Args& a, const std::string& fallback) {
  std::vector<Recipe> out;
  for (const std::string& name : a.get_list("recipes", fallback)) {
    Recipe r;
    if (!parse_recipe(name, &r)) {
      throw UsageError("--recipes: unknown recipe '" + name + "' (see fp4attn recipes)");
    }
    out.push_back(r);
  }
  return out;
}

std::vector<KvCacheFormat> cache_format_list(const Args& a, const std::string& fallback) {
  std::vector<KvCacheFormat> out;
  for (const std::string& name : a.get_list("recipes", fallback)) {
    if (name == "nvfp4") {
      out.push_back(KvCacheFormat::kNvfp4);
    } else if (name == "fp8") {
      out.push_back(KvCacheFormat::kFp8);
    } else {
      throw UsageError("--recipes: expected cache formats nvfp4 and fp8, got '" + name + "'");
    }
  }
  return out;
}

}  // namespace fp4attn::bench
