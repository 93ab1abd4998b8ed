// Argument checks of the forward entry points
// (include/fp4attn/attention_cuda.h), on the host so that they are tested on
// machines without a GPU.
#pragma once

#include <cstdint>

#include "fp4attn/attention.h"

namespace fp4attn {

// Shapes of a validated forward problem.
struct ForwardShape {
  int64_t b = 0, h = 0, h_kv = 0, s_q = 0, s_k = 0, d = 0;
};

// Checks operands (operands.h layouts), o, lse and options; fills `shape`.
Status validate_forward_operands(const ForwardOperands& in, const ForwardOptions& opt,
                                 const TensorView& o, const TensorView& lse, ForwardShape* shape);

// A per-row FP32 statistic of the forward (lse, row_max): shape [b, h, s_q], last stride 1.
Status check_row_stats(const TensorView& t, const char* name, const ForwardShape& sh);

// Checks BSHD q/k/v (BF16/FP16, d contiguous), o, lse and options; fills
// `shape`.
Status validate_forward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse, ForwardShape* shape);

// Checks the varlen entry point's arguments (attention_cuda.h).
Status validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                               int64_t batch, const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse);

}  // namespace fp4attn
