// Argument checks of the GPU backward (include/fp4attn/attention_bwd_cuda.h), on the host so that
// they are tested on machines without a GPU.
#pragma once

#include "fp4attn/attention.h"
#include "fp4attn/attention_bwd.h"
#include "validate/validate_forward.h"

namespace fp4attn {

// Whether the recipe's backward needs the forward's row_max (nvfp4-fast, fp4-direct).
bool backward_needs_row_max(Recipe recipe);

// row_max ([b, h, s_q] FP32, attention_cuda.h): required where the recipe needs it; checked and
// ignored where it does not.
Status validate_backward_row_max(const ForwardOptions& opt, const TensorView& row_max,
                                 const ForwardShape& sh);

// Operands (as validate_forward_operands), o, lse (required), dout, dq/dk/dv; fills `shape`.
Status validate_backward_operands(const ForwardOperands& in, const ForwardOptions& opt,
                                  const TensorView& o, const TensorView& lse,
                                  const TensorView& dout, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv, ForwardShape* shape);

// BSHD q/k/v (as validate_forward_inputs), then the same checks of o, lse, dout and gradients.
Status validate_backward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                const ForwardOptions& opt, const TensorView& o,
                                const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, ForwardShape* shape);

// BackwardCudaOptions: d_source a known value.
Status validate_backward_options(const BackwardCudaOptions& bopt);

}  // namespace fp4attn
