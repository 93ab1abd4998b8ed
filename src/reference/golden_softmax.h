// P generation of the golden model: one query row's scores -> the P values the PV product
// consumes and the row's denominator, per recipe (docs/numerics.md, "P").
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/golden/golden.h"

namespace fp4attn::golden {

struct RowP {
  std::vector<double> p;  // P operand values of the visible keys (MMA units)
  double p_unit = 1;      // p * p_unit is in the units of l
  double l = 0;           // the row's denominator
  double lse_log2 = 0;    // log2 of sum_j 2^z_j as the recipe estimates it
  int64_t zeros = 0;      // visible keys whose P is exactly zero
};

// z: log2-domain scores z_j = scale * log2(e) * q.k_j of the n visible keys (n >= 1), keys
// 0..n-1 in natural order (blocks of P are aligned to key 0).
// block_param (optional): each visible key's quantization-block parameter, for comparisons with
// kernel P dumps (p_dump_compare.h): fp4-direct its 32-key block exponent e (-1000 for a zero
// block), nvfp4-all its 16-key block's E4M3 scale value, 0 for the other recipes.
RowP make_row_p(const std::vector<double>& z, int64_t n, const RecipeOptions& opt,
                std::vector<double>* block_param = nullptr);

// The integer log2 row reference: ceil of the largest score, NaN ignored (as fmaxf does).
double integer_row_max(const std::vector<double>& z, int64_t n);

}  // namespace fp4attn::golden
