// P as the backward rebuilds it, one query row at a time (docs/numerics.md §8).
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/golden/golden.h"

namespace fp4attn::golden {

// nvfp4-fast and fp4-direct make P without exp2 (a code map from the integer row reference); the
// backward rebuilds their codes rather than an exponential.
bool has_exp_free_p(Recipe r);

// Normalized P of one row (p[j] multiplies v_j in O) from the log2-domain scores z of its n >= 1
// visible keys, computed exactly as the forward computed them.
// * exp2 recipes: p_j = exp2(z_j - lse_log2), lse_log2 the forward's LSE in log2 units (without
//   the smooth_k term): the unrounded softmax, whatever rounding the forward's P operand had.
// * exp-free recipes: the forward's own P values divided by its denominator (the codes rebuilt
//   from ceil(max z), the integer reference the forward used; lse_log2 is not read).
void backward_row_p(const std::vector<double>& z, int64_t n, double lse_log2,
                    const RecipeOptions& opt, std::vector<double>* p);

}  // namespace fp4attn::golden
