// CPU golden model. This part: exact softmax attention in float64, the yardstick every recipe
// and kernel is measured against (DESIGN.md "Testing"; conventions are FlashAttention's).
#pragma once

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct AttentionOptions {
  double softmax_scale = 0;  // 0 means 1/sqrt(head_dim); otherwise finite and > 0
  bool causal = false;  // aligned bottom-right: key j visible to query i iff j <= i + s_k - s_q
};

// O = softmax(scale * Q K^T) V per (batch, head), computed in float64 with a two-pass (max, then
// sum) softmax per row. q [b, s_q, h, d], k and v [b, s_k, h_kv, d] in f64/f32/bf16/f16, any
// strides with the last one 1; h % h_kv == 0 (query head i reads kv head i / (h / h_kv)); any
// head_dim 1..512. o [b, s_q, h, d] in f64/f32/bf16/f16. lse [b, h, s_q] in f32/f64 receives
// ln sum_j exp(scale * q.k_j) over the visible keys; pass TensorView{} for none. A row with no
// visible key (s_k == 0, or causal with s_q > s_k) gets O = 0 and LSE = +inf. Multithreaded
// (FP4ATTN_NUM_THREADS); the result does not depend on the thread count.
Status reference_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& opt, const TensorView& o,
                                   const TensorView& lse);

// Float64 gradients of the exact attention above for the upstream gradient dout [like q]:
// dq [like q], dk and dv [like k], each f64 or f32. P is recomputed exactly and
// D = rowsum(dout * O) uses the exact O. GQA: dk/dv are summed over the query heads of the group.
// Rows with no visible key contribute nothing. Deterministic for any thread count.
Status reference_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& dout, const AttentionOptions& opt,
                                    const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv);

}  // namespace fp4attn
