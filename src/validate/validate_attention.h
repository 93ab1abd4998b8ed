// Argument checks shared by every attention entry point (the float64 reference, the recipes and
// the GPU dispatch), so that all of them reject bad input with the same messages.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct AttentionShape {
  int64_t b, s_q, s_k, h, h_kv, d;
};

// Checks q [b, s_q, h, d], k and v [b, s_k, h_kv, d], o [b, s_q, h, d] and, when lse.defined(),
// lse [b, h, s_q] (f32/f64): ranks, non-negative sizes, dtypes (q/k/v in `allowed_in`, o in
// `allowed_out`), strides (>= 0, last dimension 1), non-null data for non-empty tensors, matching
// shapes, h % h_kv == 0 and head_dim in `allowed_d` (empty = any d in [1, 512]). Fills *shape.
// Messages name the argument, e.g. "q/k: number of heads 6 is not a multiple of kv heads 4".
// o and lse are outputs: a stride of 0 on a dimension of size > 1 is refused (overlapping writes).
Status validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView& lse,
                          std::initializer_list<DType> allowed_in,
                          std::initializer_list<DType> allowed_out,
                          std::initializer_list<int> allowed_d, AttentionShape* shape);

// head_dim d in `allowed_d` (empty: any d in [1, 512]); the message names the argument `name`.
Status check_head_dim(int64_t d, std::initializer_list<int> allowed_d, const char* name);

// head_dim d one of the kernel operands' (operands.h kOperandHeadDims): "q_data: head_dim 96 is not
// supported (supported: 64, 128)".
Status check_operand_head_dim(int64_t d, const char* name);

// The same checks with another name for `o` in messages, and `o` and `lse` treated as inputs
// (zero strides allowed): backward passes dout there, which may be a broadcast tensor.
Status validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView& lse,
                          std::initializer_list<DType> allowed_in,
                          std::initializer_list<DType> allowed_out,
                          std::initializer_list<int> allowed_d, AttentionShape* shape,
                          const char* o_name);

// Checks an output that must have the shape of `like` (gradients): rank, sizes, dtype in
// `allowed`, strides, non-null data and no overlap (check_output_strides).
// "dq: expected shape (2, 64, 8, 64) like q, got (...)".
Status check_like(const TensorView& t, const char* name, const TensorView& like,
                  const char* like_name, std::initializer_list<DType> allowed);

// A non-empty output must not write one element twice: no stride 0 on a dimension of size > 1.
Status check_output_strides(const TensorView& t, const char* name);

// The recipe is one of kAllRecipes (a value cast from an integer need not be):
// "recipe: unknown recipe value 12".
Status check_recipe_value(Recipe recipe);

// Resolves 0 to 1/sqrt(d); any other value must be finite and > 0:
// "softmax_scale: expected a finite value > 0, got -1".
Status resolve_softmax_scale(double softmax_scale, int64_t d, double* out);

}  // namespace fp4attn
