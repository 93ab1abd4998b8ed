// The forward's kernel operands of BF16/FP16 q/k/v, quantized into stream-ordered scratch for
// one use: attention_forward_cuda runs the engine on them, attention_backward_cuda the backward
// (the same quantizers, so the same bytes as the forward's).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "fp4attn/attention.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"
#include "validate/validate_forward.h"

namespace fp4attn {

// Allocates the operands of shape sh (cudaMallocAsync), quantizes q, k, v with opt.recipe on
// `stream`, calls use(operands, k_mean), and frees the scratch on `stream` (usable again once
// the queued work ends). k_mean: FP32 [b, h_kv, d], the mean K was smoothed by where the recipe
// smooths K (recipe_smooths_k), undefined otherwise. Returns the first error.
using OperandUse = std::function<Status(const ForwardOperands&, const TensorView& k_mean)>;
Status with_quantized_operands(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const ForwardShape& sh,
                               cudaStream_t stream, const OperandUse& use);

}  // namespace fp4attn
