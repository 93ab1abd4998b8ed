// The GPU backend of `fp4attn run`: the Hopper engine on host inputs (built when CUDA is; a stub
// that reports why not otherwise).
#pragma once

#include <string>

#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::cli {

// Empty when the GPU backend can run `recipe` here; otherwise the reason, for the user.
std::string gpu_unavailable_reason(Recipe recipe);

// The name of the CUDA device the GPU backends run on ("NVIDIA H200"); empty without one.
std::string gpu_device_name();

// q [b, s_q, h, d], k/v [b, s_k, h_kv, d] host FP32 holding BF16-exact values; o [b, s_q, h, d]
// and lse [b, h, s_q] host F64. *ms: median wall time of one call (quantization + kernel) over
// a few timed calls after a warm-up.
Status run_attention_gpu(const TensorView& q, const TensorView& k, const TensorView& v,
                         Recipe recipe, bool causal, double softmax_scale, const TensorView& o,
                         const TensorView& lse, double* ms);

}  // namespace fp4attn::cli
