// quantize_operand_cuda: validation (shared with the host reference) plus the GPU-only checks,
// then the role's launcher.
#include <cstdint>
#include <string>

#include "fp4attn/operands_cuda.h"
#include "validate/validate_operands.h"

namespace fp4attn {

Status quantize_operand_cuda(const TensorView& x, Recipe recipe, OperandRole role,
                             const OperandOptions& opt, const TensorView& data,
                             const TensorView& scale, const TensorView& mean, cudaStream_t stream) {
  OperandOptions o = opt;  // the int8 recipes' K is smoothed whatever opt says
  o.smooth_k = role == OperandRole::kK && k_is_smoothed(recipe, opt.smooth_k);
  FP4ATTN_RETURN_IF_ERROR(
      validate_operand(x, recipe, role, o, data, scale, mean, {DType::kBF16, DType::kF16}));
  // The kernels read x in 16-byte vectors along head_dim.
  if (reinterpret_cast<uintptr_t>(x.data) % 16 != 0) {
    return Status::Invalid("x: data pointer must be 16-byte aligned");
  }
  for (int i = 0; i < 3; ++i) {
    if (x.shape[i] > 1 && x.stride[i] % 8 != 0) {
      return Status::Invalid("x: stride of dimension " + std::to_string(i) +
                             " must be a multiple of 8 elements (16 bytes), got " +
                             std::to_string(x.stride[i]));
    }
  }
  // No (batch, head): nothing to write. s == 0 still reaches the launchers (V's channel scales
  // are 1 then, as the host reference writes).
  if (x.shape[0] == 0 || x.shape[2] == 0) return Status::Ok();
  if (role == OperandRole::kV) {
    return detail::quantize_v_operand_cuda(x, recipe, o, data, scale, stream);
  }
  return detail::quantize_qk_operand_cuda(x, recipe, o, data, scale, mean, stream);
}

}  // namespace fp4attn
