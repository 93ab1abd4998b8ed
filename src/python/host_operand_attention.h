// Forward attention over kernel operands on the host: what attention_forward_operands_cuda
// computes, evaluated with the golden model's arithmetic (float64 scores, the recipe's P). It lets
// CPU users quantize once (quantize_operand_host) and reuse the operands, as GPU users do.
//
// It lives with the Python extension because only the extension needs it today; it belongs next
// to golden_attention_forward once another caller appears.
#pragma once

#include "fp4attn/attention.h"
#include "fp4attn/golden.h"

namespace fp4attn::py {

// `in`: the six operands in the layouts of include/fp4attn/operands.h (V keys permuted), as for
// attention_forward_operands_cuda; every recipe is accepted. o [b, s_q, h, d]
// BF16/FP16/FP32/FP64 (last dim contiguous), lse FP32/FP64 [b, h, s_q] or undefined. opt.recipe
// must be the recipe the operands were quantized with: data are E4M3 (BF16 for bf16). On operands
// from quantize_operand_host of q, k, v the result equals golden_attention_forward(q, k, v) bit for
// bit (smooth_k aside: the operands carry no q, so the LSE cannot be corrected; opt.smooth_k is
// refused).
Status attention_forward_operands_host(const ForwardOperands& in, const RecipeOptions& opt,
                                       const TensorView& o, const TensorView& lse);

}  // namespace fp4attn::py
