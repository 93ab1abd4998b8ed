#include "validate/validate_backward.h"

#include <string>

#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

Status check_recipe(const ForwardOptions& opt) {
  if (!recipe_has_gpu_backward(opt.recipe)) {
    return Status::Unsupported(std::string("recipe: '") + recipe_name(opt.recipe) +
                               "' has no GPU backward (it has no GPU forward: the engine runs " +
                               gpu_recipe_names() +
                               "; the CPU golden model has every recipe's backward)");
  }
  return Status::Ok();
}

// A BSHD tensor of shape `want` with dtype in `allowed` and d contiguous.
Status check_bshd(const TensorView& t, const char* name, const int64_t (&want)[4],
                  std::initializer_list<DType> allowed, bool output) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(t, name, 4, "(batch, seqlen, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, allowed));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(t, name));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != want[i]) {
      return Status::Invalid(std::string(name) + ": expected shape (" + str(want[0]) + ", " +
                             str(want[1]) + ", " + str(want[2]) + ", " + str(want[3]) + "), got " +
                             t.shape_str());
    }
  }
  if (output) FP4ATTN_RETURN_IF_ERROR(check_output_strides(t, name));
  return Status::Ok();
}

// What both entry points check after the forward's own checks filled `sh`.
Status check_backward_rest(const TensorView& lse, const TensorView& dout, const TensorView& dq,
                           const TensorView& dk, const TensorView& dv, const ForwardShape& sh) {
  const int64_t qshape[4] = {sh.b, sh.s_q, sh.h, sh.d};
  const int64_t kshape[4] = {sh.b, sh.s_k, sh.h_kv, sh.d};
  FP4ATTN_RETURN_IF_ERROR(check_bshd(dout, "dout", qshape, {DType::kBF16, DType::kF16}, false));
  FP4ATTN_RETURN_IF_ERROR(check_bshd(dq, "dq", qshape, {DType::kF32, DType::kBF16}, true));
  FP4ATTN_RETURN_IF_ERROR(check_bshd(dk, "dk", kshape, {DType::kF32, DType::kBF16}, true));
  FP4ATTN_RETURN_IF_ERROR(check_bshd(dv, "dv", kshape, {DType::kF32, DType::kBF16}, true));
  (void)lse;  // checked by the forward's validation once defined
  return Status::Ok();
}

}  // namespace

Status validate_backward_options(const BackwardCudaOptions& bopt) {
  if (bopt.d_source != DSource::kForwardO && bopt.d_source != DSource::kHighPrecisionO) {
    return Status::Invalid("d_source: unknown DSource value " +
                           str(static_cast<int64_t>(bopt.d_source)));
  }
  return Status::Ok();
}

bool backward_needs_row_max(Recipe recipe) { return recipe_p_is_exp_free(recipe); }

Status validate_backward_row_max(const ForwardOptions& opt, const TensorView& row_max,
                                 const ForwardShape& sh) {
  if (!backward_needs_row_max(opt.recipe)) {
    return row_max.defined() ? check_row_stats(row_max, "row_max", sh) : Status::Ok();
  }
  if (!row_max.defined()) {
    return Status::Invalid(std::string("row_max: required for '") + recipe_name(opt.recipe) +
                           "' (the forward's row_max output: its P codes are rebuilt from it)");
  }
  return check_row_stats(row_max, "row_max", sh);
}

Status validate_backward_operands(const ForwardOperands& in, const ForwardOptions& opt,
                                  const TensorView& o, const TensorView& lse,
                                  const TensorView& dout, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv, ForwardShape* shape) {
  FP4ATTN_RETURN_IF_ERROR(check_recipe(opt));
  if (!lse.defined()) {
    return Status::Invalid("lse: required (the forward's FP32 LSE [b, h, s_q])");
  }
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_operands(in, opt, o, lse, &sh));
  FP4ATTN_RETURN_IF_ERROR(check_backward_rest(lse, dout, dq, dk, dv, sh));
  *shape = sh;
  return Status::Ok();
}

Status validate_backward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                const ForwardOptions& opt, const TensorView& o,
                                const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, ForwardShape* shape) {
  FP4ATTN_RETURN_IF_ERROR(check_recipe(opt));
  if (!lse.defined()) {
    return Status::Invalid("lse: required (the forward's FP32 LSE [b, h, s_q])");
  }
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, opt, o, lse, &sh));
  FP4ATTN_RETURN_IF_ERROR(check_backward_rest(lse, dout, dq, dk, dv, sh));
  *shape = sh;
  return Status::Ok();
}

}  // namespace fp4attn
