// Options and operands of the forward attention entry points (host header, no CUDA types);
// include/fp4attn/attention_cuda.h has the GPU functions.
#pragma once

#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct ForwardOptions {
  Recipe recipe = Recipe::kFp8;
  float softmax_scale = 0;  // 0 means 1/sqrt(head_dim)
  bool causal = false;      // bottom-right aligned, as FlashAttention
};

struct ForwardOperands {
  // Layouts of operands.h: q_data [b, h, s_q, d] E4M3, q_scale FP32 [b, h, ceil(s_q/128)],
  // k_data [b, h_kv, s_k, d], k_scale [b, h_kv, ceil(s_k/128)],
  // v_data [b, h_kv, d, s_pad16(s_k)] (key order of operands.h), v_scale [b, h_kv, d].
  TensorView q_data, q_scale, k_data, k_scale, v_data, v_scale;
};

}  // namespace fp4attn
