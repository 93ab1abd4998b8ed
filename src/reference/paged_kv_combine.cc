// The exact LSE-weighted merge of split-KV partials, in float64. It is its own function because
// the GPU split-KV kernels are checked against it: their partials merged here must equal their
// own combine kernel's output (up to its FP32 arithmetic).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "fp4attn/golden/paged_kv.h"
#include "validate/validate_attention.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Status check_outputs(const TensorView& op, const TensorView& o, const TensorView& lse) {
  const int64_t total_q = op.shape[1], h = op.shape[2], d = op.shape[3];
  FP4ATTN_RETURN_IF_ERROR(check_rank(o, "o", 3, "(total_q, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(
      check_dtype(o, "o", {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(o, "o"));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(o, "o"));
  if (o.shape[0] != total_q || o.shape[1] != h || o.shape[2] != d) {
    return Status::Invalid("o: expected shape (" + std::to_string(total_q) + ", " +
                           std::to_string(h) + ", " + std::to_string(d) +
                           ") like o_partial without its splits, got " + o.shape_str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_output_strides(o, "o"));
  if (!lse.defined()) return Status::Ok();
  FP4ATTN_RETURN_IF_ERROR(check_rank(lse, "lse", 2, "(heads, total_q)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(lse, "lse", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(lse, "lse"));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(lse, "lse"));
  if (lse.shape[0] != h || lse.shape[1] != total_q) {
    return Status::Invalid("lse: expected shape (" + std::to_string(h) + ", " +
                           std::to_string(total_q) + ") (heads, total_q), got " + lse.shape_str());
  }
  return check_output_strides(lse, "lse");
}

}  // namespace

Status combine_attention_partials(const TensorView& o_partial, const TensorView& lse_partial,
                                  const TensorView& o, const TensorView& lse) {
  FP4ATTN_RETURN_IF_ERROR(validate_partials(
      o_partial, lse_partial, {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}, false));
  FP4ATTN_RETURN_IF_ERROR(check_outputs(o_partial, o, lse));
  const TensorView &op = o_partial, &lp = lse_partial;
  const int64_t splits = op.shape[0], total_q = op.shape[1], h = op.shape[2], d = op.shape[3];
  parallel_for(total_q, [&](int64_t r) {
    std::vector<double> w(splits), acc(d);
    for (int64_t hq = 0; hq < h; ++hq) {
      double m = -kInf;
      for (int64_t s = 0; s < splits; ++s) {
        w[s] = load_as_double(lp, s * lp.stride[0] + r * lp.stride[1] + hq * lp.stride[2]);
        if (!(w[s] <= m)) m = w[s];  // takes a NaN, so that it reaches the output
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double row_lse = kInf;  // every partial empty: O = 0, the user-facing LSE +inf
      if (m != -kInf) {
        double sum = 0;
        for (int64_t s = 0; s < splits; ++s) {
          // An empty partial (-inf, O = 0) weighs exactly 0. Nothing is skipped, so that a NaN in
          // a partial's O (NaN V) reaches the row as it does without splits.
          w[s] = std::exp(w[s] - m);
          sum += w[s];
        }
        for (int64_t s = 0; s < splits; ++s) {
          const int64_t base = s * op.stride[0] + r * op.stride[1] + hq * op.stride[2];
          const double ws = w[s] / sum;
          for (int64_t c = 0; c < d; ++c) acc[c] += ws * load_as_double(op, base + c);
        }
        row_lse = m + std::log(sum);
      }
      const int64_t base = r * o.stride[0] + hq * o.stride[1];
      for (int64_t c = 0; c < d; ++c) store_from_double(o, base + c, acc[c]);
      if (lse.defined()) store_from_double(lse, hq * lse.stride[0] + r * lse.stride[1], row_lse);
    }
  });
  return Status::Ok();
}

}  // namespace fp4attn
