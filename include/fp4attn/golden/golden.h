// The CPU golden model of the quantized recipes: what every GPU kernel of a recipe computes
// (docs/numerics.md is the prose version of this contract).
#pragma once

#include <cstdint>

#include "fp4attn/attention.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

// How block-scaled products are formed.
enum class Emulation {
  // Hopper (sm_90a): block scales folded into E4M3 operands (DESIGN.md "Scale folding"); this is
  // what our kernels compute and the default.
  kFoldedE4M3,
  // Blackwell block-scaled MMA: e2m1 x e2m1 (or e4m3) products with the scales applied exactly.
  // Used to measure what folding costs against the Blackwell kernels' arithmetic.
  kBlockScaledExact,
};

struct RecipeOptions {
  Recipe recipe = Recipe::kNvfp4;
  double softmax_scale = 0;  // 0 means 1/sqrt(head_dim)
  bool causal = false;       // bottom-right aligned, as FlashAttention
  // Subtract each (batch, kv head)'s key mean before quantizing K (SageAttention's smoothing).
  // Softmax is unchanged; the LSE is corrected by scale * q . mean.
  bool smooth_k = false;
  // Static NVFP4 per-tensor encode scales s_enc (decode x = e2m1 * scale / s_enc), e.g. from a
  // checkpoint. 0 means computed from the data per (batch, head).
  float q_tensor_scale = 0;
  float k_tensor_scale = 0;
  float v_tensor_scale = 0;
  Emulation emulation = Emulation::kFoldedE4M3;
};

// Counters a caller can ask for: how many visible P elements the recipe produced and how many of
// them rounded to zero (underflow).
struct RecipeStats {
  int64_t p_elements = 0;
  int64_t p_zero = 0;
};

// Forward attention of one recipe. q [b, s_q, h, d], k/v [b, s_k, h_kv, d] in BF16/FP16/FP32/FP64
// (read as FP32 values: BF16/FP16 inputs are exact; the bf16 recipe rounds its operands to BF16),
// o [b, s_q, h, d] (any float dtype), lse [b, h, s_q] FP32/FP64 or undefined (natural log; +inf
// for rows without keys, whose O is 0). head_dim must be 64 or 128. Multithreaded over heads.
Status golden_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const RecipeOptions& opt, const TensorView& o,
                                const TensorView& lse, RecipeStats* stats = nullptr);

// Forward attention over kernel operands (the layouts of operands.h, V keys permuted), as
// attention_forward_operands_cuda reads them: the golden model's arithmetic (float64 scores, the
// recipe's P) on the stored codes and factors. in: host memory, every recipe (data E4M3, BF16 for
// bf16); opt.recipe must be the one the operands were made for (it picks P's rule); smooth_k is
// refused (the operands carry no q for the LSE correction). o [b, s_q, h, d] BF16/FP16/FP32/FP64
// (any strides, last dim contiguous), lse FP32/FP64 [b, h, s_q] or undefined. On operands from
// quantize_operand_host of q, k, v the result equals golden_attention_forward(q, k, v) bit for
// bit. Used by the Python package's host path and as the same-numerics reference of paged prefill.
Status golden_attention_forward_operands(const ForwardOperands& in, const RecipeOptions& opt,
                                         const TensorView& o, const TensorView& lse);

}  // namespace fp4attn
