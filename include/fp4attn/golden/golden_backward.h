// The golden model's backward: float64 gradients of each recipe's forward semantics (issue 8;
// docs/numerics.md §8 states what they are the gradient of and every FP8 offset).
#pragma once

#include "fp4attn/attention_bwd.h"  // DSource
#include "fp4attn/golden/golden.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

enum class BackwardArithmetic {
  kFloat64,  // every product and sum in float64
  // The GPU's GEMM operands: E4M3 Q, K, V (the forward's), P and dS; E5M2 dO; float64 sums.
  kEmulatedFp8,
};

// kEmulatedFp8: the granularity of dS's power-of-two scales (numerics.md §8).
enum class DsScales {
  // One exponent per (batch, head) for each of dQ's and dK's dS operand, from the slice's amax
  // (with D from the forward's O): what the GPU's v1 kernel measures in its amax pass.
  kPerHead,
  // Per tile of the v2 kernel (128 keys x 64 queries of one head), from the tile's own dS (the D
  // of d_source): dQ's operand by the tile's amax of |dS k_scale|; dK's by a running exponent per
  // 128-key block, the minimum over the head's query blocks so far (in ascending order) of the
  // tiles' exponents for |dS q_scale| (a kernel can keep it by scaling its dK sums down).
  // Needs no pass over the scores before the gradients: the GPU's v2 kernel (the default).
  kPerTile,
};

struct BackwardOptions {
  DSource d_source = DSource::kForwardO;
  BackwardArithmetic arithmetic = BackwardArithmetic::kFloat64;
  // kEmulatedFp8 only. The P operand is E4M3(2^p_lift_log2 * p) (p <= 1); dO and dS get a
  // power-of-two scale per (batch, head) when scale_gradients. Exposed so tests can show what
  // dropping either offset costs; keep the defaults otherwise.
  int p_lift_log2 = 8;
  bool scale_gradients = true;
  DsScales ds_scales = DsScales::kPerTile;
};

// Gradients of golden_attention_forward(q, k, v, opt) for the upstream gradient dout.
// q/k/v/opt: what the forward was given (the operands are re-quantized bit for bit); o: its output
// (f64/f32/bf16/f16, like q); lse: its LSE [b, h, s_q] (f32/f64, natural log, +inf for rows
// without keys). dq [like q], dk and dv [like k] in f64/f32. GQA: dk/dv summed over the query
// heads of a group. Rows without keys contribute nothing. Deterministic for any thread count.
Status golden_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& o, const TensorView& dout, const TensorView& lse,
                                 const RecipeOptions& opt, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv,
                                 const BackwardOptions& bopt = {});

}  // namespace fp4attn
