// Recipes: the binding names of fp4attn's numerics (DESIGN.md, docs/numerics.md).
#pragma once

#include <string_view>

namespace fp4attn {

enum class Recipe : int {
  kBf16,       // BF16 operands, exp2 softmax: the reference point
  kFp8,        // E4M3 Q/K (per 128-token block scales), E4M3 P, E4M3 V (per-channel scales): the
               // Python package's default (docs/decisions.md)
  kNvfp4,      // NVFP4 Q/K (Four-Over-Six scales), E4M3 P/V: the accurate FP4 recipe
  kNvfp4Hx,    // NVFP4 Q/K with scale mantissas in {1, 1.25, 1.5}: exact on FP8 tensor cores
  kMxfp4,      // MXFP4 Q/K (E8M0, exact folding), E4M3 P/V
  kNvfp4Fast,  // NVFP4 Q/K, E4M3 P from the exp-free direct code map, E4M3 V
  kNvfp4All,   // NVFP4 Q/K/P/V, P with a fixed global scale
  kFp4Direct,  // the seed paper: NVFP4 Q/K, MXFP4 P (affine surrogate) and V
  kFp8Fast,    // fp8's operands, E4M3 P from the exp-free code map (nvfp4-fast's P)
  kInt8,       // INT8 Q/K (per 128-token scales, K smoothed by its mean), E4M3 P (exp2), E4M3 V
  kInt8Fast,   // int8's operands, E4M3 P from the exp-free code map
};

constexpr Recipe kAllRecipes[] = {Recipe::kBf16,      Recipe::kFp8,      Recipe::kFp8Fast,
                                  Recipe::kNvfp4,     Recipe::kNvfp4Hx,  Recipe::kMxfp4,
                                  Recipe::kNvfp4Fast, Recipe::kNvfp4All, Recipe::kFp4Direct,
                                  Recipe::kInt8,      Recipe::kInt8Fast};

// The recipes the GPU forward engine runs, in the order messages list them: all but bf16, whose
// attention is the CPU golden model's only.
constexpr Recipe kGpuRecipes[] = {
    Recipe::kFp8,     Recipe::kFp8Fast, Recipe::kInt8,     Recipe::kInt8Fast,  Recipe::kNvfp4,
    Recipe::kNvfp4Hx, Recipe::kMxfp4,   Recipe::kNvfp4All, Recipe::kNvfp4Fast, Recipe::kFp4Direct};
// The recipes the GPU backward runs.
constexpr Recipe kGpuBackwardRecipes[] = {Recipe::kFp8,       Recipe::kFp8Fast,  Recipe::kNvfp4,
                                          Recipe::kNvfp4Hx,   Recipe::kMxfp4,    Recipe::kNvfp4All,
                                          Recipe::kNvfp4Fast, Recipe::kFp4Direct};

// Whether r is one of kAllRecipes (a value cast from an integer need not be).
constexpr bool recipe_is_valid(Recipe r) {
  for (Recipe a : kAllRecipes) {
    if (a == r) return true;
  }
  return false;
}

// The recipe whose Q/K/V operands (formats, scales, quantizers) a recipe uses: fp8-fast and
// int8-fast are fp8's and int8's operands with another P.
constexpr Recipe operand_recipe(Recipe r) {
  if (r == Recipe::kFp8Fast) return Recipe::kFp8;
  if (r == Recipe::kInt8Fast) return Recipe::kInt8;
  return r;
}
// INT8 Q/K (numerics.md §3): S from the s8 MMA's exact integer sums.
constexpr bool recipe_qk_is_int8(Recipe r) { return operand_recipe(r) == Recipe::kInt8; }
// K always smoothed by its per-(batch, kv head) channel mean, whatever OperandOptions::smooth_k
// says: INT8's one scale per 128 tokens spends its levels on the offset otherwise.
constexpr bool recipe_smooths_k(Recipe r) { return recipe_qk_is_int8(r); }
// Whether K is smoothed under a recipe and its smooth_k option.
constexpr bool k_is_smoothed(Recipe r, bool smooth_k) { return smooth_k || recipe_smooths_k(r); }
// P from the exp-free E4M3 code map (numerics.md §4): clamp(RNE(8 (z - m)) + 120, 0, 120).
constexpr bool recipe_p_is_codes(Recipe r) {
  return r == Recipe::kNvfp4Fast || r == Recipe::kFp8Fast || r == Recipe::kInt8Fast;
}
// P without exp2 (the code map or fp4-direct's surrogate): the backward rebuilds it from the
// forward's row_max rather than from the LSE.
constexpr bool recipe_p_is_exp_free(Recipe r) {
  return recipe_p_is_codes(r) || r == Recipe::kFp4Direct;
}

bool recipe_has_gpu_forward(Recipe r);
bool recipe_has_gpu_backward(Recipe r);
// "fp8, nvfp4, ...": the names of kGpuRecipes, for messages.
const char* gpu_recipe_names();

const char* recipe_name(Recipe r);     // "nvfp4-hx", ...
const char* recipe_summary(Recipe r);  // one line for `fp4attn recipes`
bool parse_recipe(std::string_view name, Recipe* out);

}  // namespace fp4attn
