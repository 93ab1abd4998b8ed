#include "validate/validate_operands.h"

#include <cmath>
#include <string>

#include "validate/validate_attention.h"

namespace fp4attn {
Status validate_operand(const TensorView& x, Recipe recipe, OperandRole role,
                        const OperandOptions& opt, const TensorView& data, const TensorView& scale,
                        const TensorView& mean, std::initializer_list<DType> allowed_x) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(x, "x", 4, "(batch, seqlen, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(x, "x", allowed_x));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(x, "x"));
  FP4ATTN_RETURN_IF_ERROR(check_strides(x, "x"));
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  FP4ATTN_RETURN_IF_ERROR(check_operand_head_dim(d, "x"));
  FP4ATTN_RETURN_IF_ERROR(check_recipe_value(recipe));
  if (!(opt.tensor_scale >= 0) || !std::isfinite(opt.tensor_scale)) {
    return Status::Invalid("tensor_scale: expected a finite value >= 0 (0 = computed), got " +
                           std::to_string(opt.tensor_scale));
  }
  if (opt.smooth_k && role != OperandRole::kK) {
    return Status::Invalid("smooth_k: only the K operand can be smoothed");
  }
  const DType code_type = operand_data_dtype(recipe, role);
  if (role == OperandRole::kV) {
    FP4ATTN_RETURN_IF_ERROR(
        check_contiguous_shape(data, "data", {b, h, d, operand_v_pitch(s)}, code_type));
    FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(scale, "scale", {b, h, d}, DType::kF32));
  } else {
    FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(data, "data", {b, h, s, d}, code_type));
    FP4ATTN_RETURN_IF_ERROR(
        check_contiguous_shape(scale, "scale", {b, h, operand_scale_tiles(s)}, DType::kF32));
  }
  if (role == OperandRole::kK && k_is_smoothed(recipe, opt.smooth_k)) {
    FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(mean, "mean", {b, h, d}, DType::kF32));
  }
  return Status::Ok();
}

}  // namespace fp4attn
