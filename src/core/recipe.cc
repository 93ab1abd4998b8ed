#include "fp4attn/recipe.h"

#include <string>

namespace fp4attn {

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::kBf16:
      return "bf16";
    case Recipe::kFp8:
      return "fp8";
    case Recipe::kNvfp4:
      return "nvfp4";
    case Recipe::kNvfp4Hx:
      return "nvfp4-hx";
    case Recipe::kMxfp4:
      return "mxfp4";
    case Recipe::kNvfp4Fast:
      return "nvfp4-fast";
    case Recipe::kNvfp4All:
      return "nvfp4-all";
    case Recipe::kFp4Direct:
      return "fp4-direct";
    case Recipe::kFp8Fast:
      return "fp8-fast";
    case Recipe::kInt8:
      return "int8";
    case Recipe::kInt8Fast:
      return "int8-fast";
  }
  return "unknown";
}

const char* recipe_summary(Recipe r) {
  switch (r) {
    case Recipe::kBf16:
      return "BF16 Q/K/P/V, exp2 softmax (the reference point)";
    case Recipe::kFp8:
      return "E4M3 Q/K (scale per 128 tokens), E4M3 P (exp2, 2^8 lift), E4M3 V (per channel)";
    case Recipe::kNvfp4:
      return "NVFP4 Q/K (block 16, E4M3 scale, tensor scale), E4M3 P (exp2) and V: default";
    case Recipe::kNvfp4Hx:
      return "NVFP4 Q/K with scale mantissas in {1, 1.25, 1.5} (exact on FP8 MMA), E4M3 P/V";
    case Recipe::kMxfp4:
      return "MXFP4 Q/K (block 32, E8M0 scale, exact on FP8 MMA), E4M3 P (exp2) and V";
    case Recipe::kNvfp4Fast:
      return "NVFP4 Q/K, E4M3 P from the exp-free direct code map, E4M3 V";
    case Recipe::kNvfp4All:
      return "NVFP4 Q/K/P/V, P with a fixed global scale (exp2)";
    case Recipe::kFp4Direct:
      return "NVFP4 Q/K, MXFP4 P (exp-free affine surrogate, Direct-P) and MXFP4 V";
    case Recipe::kFp8Fast:
      return "E4M3 Q/K (scale per 128 tokens), E4M3 P from the exp-free code map, E4M3 V";
    case Recipe::kInt8:
      return "INT8 Q/K (scale per 128 tokens, K smoothed), E4M3 P (exp2), E4M3 V (per channel)";
    case Recipe::kInt8Fast:
      return "INT8 Q/K (scale per 128 tokens, K smoothed), E4M3 P from the exp-free code map";
  }
  return "";
}

bool recipe_has_gpu_forward(Recipe r) {
  for (Recipe g : kGpuRecipes) {
    if (g == r) return true;
  }
  return false;
}

bool recipe_has_gpu_backward(Recipe r) {
  for (Recipe g : kGpuBackwardRecipes) {
    if (g == r) return true;
  }
  return false;
}

const char* gpu_recipe_names() {
  static const std::string names = [] {
    std::string s;
    for (Recipe r : kGpuRecipes) s += std::string(s.empty() ? "" : ", ") + recipe_name(r);
    return s;
  }();
  return names.c_str();
}

bool parse_recipe(std::string_view name, Recipe* out) {
  for (Recipe r : kAllRecipes) {
    if (name == recipe_name(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

}  // namespace fp4attn
