// Accuracy metrics of a tensor against a (float64) reference, BACKGROUND.md §4: cosine, relative
// L2 and L1, RMSE, max abs, plus NaN/Inf parity.
#pragma once

#include <cstdint>
#include <string>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct ErrorStats {
  int64_t n = 0;  // positions compared (all of them, finite or not); -1 after a rejected compare
  // Over the positions where both values are finite:
  double cos = 0, rel_l2 = 0, rel_l1 = 0, rmse = 0, max_abs = 0;
  int64_t nan_mismatch = 0;  // positions where isnan(test) != isnan(ref)
  int64_t inf_mismatch = 0;  // positions where isinf differs or the Inf signs differ
};

// cos = <t,r>/(|t||r|): 1 when both are all-zero, 0 when exactly one is.
// rel_l2 = |t-r|/|r| and rel_l1 = sum|t-r|/sum|r|: 0/0 -> 0, x/0 -> inf.
// rmse = sqrt(mean (t-r)^2) and max_abs = max |t-r|, 0 when no position is finite in both.
ErrorStats compare(const double* test, const double* ref, int64_t n);

// Same for two views of the same shape (any rank, f64/f32/bf16/f16, any non-negative strides).
// Views that cannot be compared give n = -1 and NaN metrics, so every threshold check fails; use
// the Status overload below to learn why.
ErrorStats compare(const TensorView& test, const TensorView& ref);
Status compare(const TensorView& test, const TensorView& ref, ErrorStats* out);

// "n=4096 cos=0.9998712 rel_l2=0.01605 rel_l1=0.01402 rmse=0.001953 max_abs=0.01172
//  nan_mismatch=0 inf_mismatch=0" (one line).
std::string to_string(const ErrorStats& s);

}  // namespace fp4attn
