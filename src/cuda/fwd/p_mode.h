// How each recipe makes P (the one table of it): the forward engine's kernels are instantiated per
// P mode, and the backward rebuilds the forward's P with the same mode's rule. Host and device.
#pragma once

#include "fp4attn/recipe.h"

namespace fp4attn::sm90 {

// exp2  (fp8, nvfp4, nvfp4-hx, mxfp4): P = E4M3(2^(z - m + 8)), unrounded row sums;
// codes (nvfp4-fast, fp8-fast): E4M3 codes RNE(8 (z - m)) + 120 without exp2, sums of the
// rounded codes;
// direct (fp4-direct): E2M1 codes of the affine surrogate per 32-key block, folded into E4M3;
// all (nvfp4-all): 2^(z - m) quantized to NVFP4 per 16-key block (global scale 2688), folded.
// kPConstant is for measuring only (wrong results): a constant P in place of the whole softmax,
// so that timing it shows what the GEMMs, the pipeline and the epilogue alone cost. The library
// never launches it; the benchmark's bound target does (docs/benchmarks.md).
enum PMode : int { kPExp2 = 0, kPCodes = 1, kPDirect = 2, kPAll = 3, kPConstant = 4 };

// The forward's P mode of an engine recipe (bf16 has no engine kernel: kPExp2, never launched).
constexpr PMode forward_p_mode(Recipe r) {
  if (recipe_p_is_codes(r)) return kPCodes;
  switch (r) {
    case Recipe::kFp4Direct:
      return kPDirect;
    case Recipe::kNvfp4All:
      return kPAll;
    default:
      return kPExp2;
  }
}

// How the backward rebuilds P: the forward's codes where P is exp-free (from its row_max), else
// exp2 from the LSE (nvfp4-all's P, NVFP4-quantized in the forward, is rebuilt unquantized).
constexpr PMode backward_p_mode(Recipe r) {
  const PMode m = forward_p_mode(r);
  return m == kPAll ? kPExp2 : m;
}

}  // namespace fp4attn::sm90
