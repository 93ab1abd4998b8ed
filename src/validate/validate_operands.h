// Argument checks of the kernel-operand quantizers (host reference and GPU), one place so that
// both reject bad input with the same messages.
#pragma once

#include <initializer_list>

#include "fp4attn/operands.h"

namespace fp4attn {

// x: rank 4 BSHD in `allowed_x`, non-null, last dim contiguous, head_dim 64 or 128; data, scale
// (and mean when opt.smooth_k) contiguous with the shapes and dtypes of operands.h;
// tensor_scale finite and >= 0; smooth_k only for K.
Status validate_operand(const TensorView& x, Recipe recipe, OperandRole role,
                        const OperandOptions& opt, const TensorView& data, const TensorView& scale,
                        const TensorView& mean, std::initializer_list<DType> allowed_x);

}  // namespace fp4attn
