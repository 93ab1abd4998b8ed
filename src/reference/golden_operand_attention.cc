// Forward attention over kernel operands on the host (golden_attention_forward_operands,
// golden.h): what attention_forward_operands_cuda computes, with the golden model's arithmetic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/parallel.h"
#include "fp4attn/golden/golden.h"
#include "fp4attn/numerics/formats.h"
#include "reference/golden_operand_scores.h"
#include "reference/golden_operands.h"
#include "reference/golden_softmax.h"
#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

struct Dims {
  int64_t b, h, h_kv, s_q, s_k, d;
};

// The operands' shapes follow from q_data [b, h, s_q, d] and k_data [b, h_kv, s_k, d].
Status validate(const ForwardOperands& in, const RecipeOptions& opt, const TensorView& o,
                const TensorView& lse, Dims* dims) {
  if (opt.smooth_k) {
    return Status::Invalid("smooth_k: not available on operands (the LSE correction needs q)");
  }
  const DType code = operand_data_dtype(opt.recipe, OperandRole::kQ);
  const DType v_code = operand_data_dtype(opt.recipe, OperandRole::kV);
  FP4ATTN_RETURN_IF_ERROR(check_rank(in.q_data, "q_data", 4, "(batch, heads, seqlen_q, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(
      check_rank(in.k_data, "k_data", 4, "(batch, kv_heads, seqlen_k, head_dim)"));
  const Dims x{in.q_data.shape[0], in.q_data.shape[1], in.k_data.shape[1],
               in.q_data.shape[2], in.k_data.shape[2], in.q_data.shape[3]};
  FP4ATTN_RETURN_IF_ERROR(check_operand_head_dim(x.d, "q_data"));
  if (x.h_kv == 0 ? x.h > 0 : x.h % x.h_kv != 0) {
    return Status::Invalid("q_data/k_data: number of heads " + std::to_string(x.h) +
                           " is not a multiple of kv heads " + std::to_string(x.h_kv));
  }
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.q_data, "q_data", {x.b, x.h, x.s_q, x.d}, code));
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.k_data, "k_data", {x.b, x.h_kv, x.s_k, x.d}, code));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.q_scale, "q_scale", {x.b, x.h, operand_scale_tiles(x.s_q)}, DType::kF32));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.k_scale, "k_scale", {x.b, x.h_kv, operand_scale_tiles(x.s_k)}, DType::kF32));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.v_data, "v_data", {x.b, x.h_kv, x.d, operand_v_pitch(x.s_k)}, v_code));
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.v_scale, "v_scale", {x.b, x.h_kv, x.d}, DType::kF32));
  const std::initializer_list<DType> floats = {DType::kF64, DType::kF32, DType::kBF16, DType::kF16};
  FP4ATTN_RETURN_IF_ERROR(check_rank(o, "o", 4, "(batch, seqlen_q, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(o, "o", floats));
  FP4ATTN_RETURN_IF_ERROR(check_strides(o, "o"));
  if (o.shape[0] != x.b || o.shape[1] != x.s_q || o.shape[2] != x.h || o.shape[3] != x.d) {
    return Status::Invalid("o: expected shape (" + std::to_string(x.b) + ", " +
                           std::to_string(x.s_q) + ", " + std::to_string(x.h) + ", " +
                           std::to_string(x.d) + "), got " + o.shape_str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_output_strides(o, "o"));
  if (o.numel() > 0) FP4ATTN_RETURN_IF_ERROR(check_not_null(o, "o"));
  if (lse.defined()) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(lse, "lse", 3, "(batch, heads, seqlen_q)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(lse, "lse", {DType::kF32, DType::kF64}));
    if (lse.shape[0] != x.b || lse.shape[1] != x.h || lse.shape[2] != x.s_q) {
      return Status::Invalid("lse: expected shape (b, h, s_q), got " + lse.shape_str());
    }
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(lse, "lse"));
    if (lse.numel() > 0) FP4ATTN_RETURN_IF_ERROR(check_not_null(lse, "lse"));
  }
  *dims = x;
  return Status::Ok();
}

// One (batch, head): the loop of golden_attention_forward, with the operands read back from the
// kernel layouts. Same operation order, so the same doubles come out.
void run_head(const ForwardOperands& in, const RecipeOptions& opt, const Dims& x, double scale,
              const TensorView& o, const TensorView& lse, int64_t bi, int64_t hi) {
  const int64_t hk = hi / (x.h / x.h_kv), d = x.d;
  const int64_t kv_head = bi * x.h_kv + hk;
  const golden::OperandScores scores(in, bi, hi, scale * std::numbers::log2e);
  std::vector<double> v(x.s_k * d);
  const int64_t pitch = operand_v_pitch(x.s_k);
  for (int64_t c = 0; c < d; ++c) {  // V^T rows back to [token, channel] in natural key order
    const int64_t row = (kv_head * d + c) * pitch;
    for (int64_t t = 0; t < x.s_k; ++t) {
      v[t * d + c] = golden::operand_code_value(in.v_data, row + operand_v_position_of(t));
    }
  }
  const float* vf = in.v_scale.as<const float>() + kv_head * d;
  const std::vector<char> v_finite = golden::finite_rows(v, x.s_k, d);

  std::vector<double> z(x.s_k), acc(d);
  for (int64_t i = 0; i < x.s_q; ++i) {
    int64_t n = x.s_k;
    if (opt.causal) n = std::clamp<int64_t>(i + x.s_k - x.s_q + 1, 0, x.s_k);
    double row_lse = std::numeric_limits<double>::infinity();  // a row without keys
    std::fill(acc.begin(), acc.end(), 0.0);
    if (n > 0) {
      scores.row(i, n, &z);
      const golden::RowP p = golden::make_row_p(z, n, opt);
      for (int64_t j = 0; j < n; ++j) {
        const double pj = p.p[j];
        if (pj == 0 && v_finite[j]) continue;  // 0 * (inf or NaN) is NaN, as in float64
        const double* vj = &v[j * d];
        for (int64_t c = 0; c < d; ++c) acc[c] += pj * vj[c];
      }
      for (int64_t c = 0; c < d; ++c) acc[c] *= double(vf[c]) * p.p_unit / p.l;
      row_lse = p.lse_log2 * std::numbers::ln2;
    }
    const int64_t obase = bi * o.stride[0] + i * o.stride[1] + hi * o.stride[2];
    for (int64_t c = 0; c < d; ++c) store_from_double(o, obase + c * o.stride[3], acc[c]);
    if (lse.defined()) {
      store_from_double(lse, bi * lse.stride[0] + hi * lse.stride[1] + i * lse.stride[2], row_lse);
    }
  }
}

}  // namespace

Status golden_attention_forward_operands(const ForwardOperands& in, const RecipeOptions& opt,
                                         const TensorView& o, const TensorView& lse) {
  FP4ATTN_RETURN_IF_ERROR(check_recipe_value(opt.recipe));
  Dims x{};
  FP4ATTN_RETURN_IF_ERROR(validate(in, opt, o, lse, &x));
  double scale = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, x.d, &scale));
  parallel_for(x.b * x.h,
               [&](int64_t bh) { run_head(in, opt, x, scale, o, lse, bh / x.h, bh % x.h); });
  return Status::Ok();
}

}  // namespace fp4attn
