#include "cli_inputs.h"

#include <cstdint>
#include <iterator>
#include <string>

namespace fp4attn::cli {

std::vector<InputKind> parse_input_kinds(const Args& a) {
  const std::string name = a.get("input", "gaussian");
  if (name == "all") return {std::begin(kAllInputKinds), std::end(kAllInputKinds)};
  InputKind k;
  if (!parse_input_kind(name, &k)) {
    throw UsageError(
        "--input: expected gaussian, outliers, large-logits, near-uniform or all, got '" + name +
        "'");
  }
  return {k};
}

std::vector<Recipe> parse_recipes(const Args& a) {
  const std::string name = a.get("recipe", "all");
  if (name == "all") return {std::begin(kAllRecipes), std::end(kAllRecipes)};
  Recipe r;
  if (!parse_recipe(name, &r)) {
    throw UsageError("--recipe: unknown recipe '" + name + "' (see fp4attn recipes)");
  }
  return {r};
}

SuiteShape parse_suite_shape(const Args& a) {
  SuiteShape sh;
  sh.b = a.get_int("batch", 1, 0, 1 << 20);
  sh.h = a.get_int("heads", 4, 1, 4096);
  sh.s = a.get_int("seqlen", 1024, 0, INT32_MAX);  // the golden model's blocks count in int
  sh.d = a.get_int("head-dim", 128, 1, 4096);
  if (sh.d != 64 && sh.d != 128) {
    throw UsageError("--head-dim: expected 64 or 128, got " + std::to_string(sh.d));
  }
  sh.causal = a.has("causal");
  sh.seed = static_cast<uint64_t>(a.get_int("seed", 0, 0, INT64_MAX));
  // The commands' buffers are multiples of this product (each checks its total).
  flag_product("q elements",
               {{"--batch", sh.b}, {"--seqlen", sh.s}, {"--heads", sh.h}, {"--head-dim", sh.d}});
  return sh;
}

int64_t flag_product(const char* what, std::initializer_list<SizeFactor> flags) {
  int64_t n = 0;
  if (const Status st = checked_product(what, flags, &n); !st.ok()) throw UsageError(st.message());
  return n;
}

void check_host_buffers(const std::string& flags, std::initializer_list<HostBuffer> buffers) {
  int64_t total = 0, one = 0;
  for (const HostBuffer& b : buffers) {
    if (!checked_mul(b.count, b.bytes, &one) || !checked_add(total, one, &total)) {
      throw UsageError(flags + ": the host buffers' byte count overflows int64");
    }
  }
  if (const Status st = check_host_bytes(flags, total); !st.ok()) throw UsageError(st.message());
}

std::vector<FlagSpec> with_suite_shape_flags(std::vector<FlagSpec> own) {
  std::vector<FlagSpec> all = {
      {"batch", true, "batch size", "1"},
      {"heads", true, "query and key/value heads", "4"},
      {"seqlen", true, "query and key tokens per sequence", "1024"},
      {"head-dim", true, "64 or 128", "128"},
      {"causal", false, "causal mask", ""},
  };
  all.insert(all.end(), own.begin(), own.end());
  return all;
}

}  // namespace fp4attn::cli
