// The golden model's scores over kernel operands (operands.h layouts, host memory): one (batch,
// head)'s log2-domain z, as golden_attention_forward_operands computes them before P. Shared
// with the kernel P-dump comparison (p_dump_compare.h), which must see the same z.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/attention.h"
#include "fp4attn/tensor.h"

namespace fp4attn::golden {

// The exact value of one stored operand code (E4M3, or BF16 for bf16).
double operand_code_value(const TensorView& t, int64_t i);

class OperandScores {
 public:
  // in: host operands; bi, hi: batch and query head (GQA maps it to its kv head); zscale:
  // softmax scale * log2(e).
  OperandScores(const ForwardOperands& in, int64_t bi, int64_t hi, double zscale);
  // z_j = (q_i . k_j) * q_factor(i) * k_factor(j) * zscale for keys 0..n-1 (float64, exact dot
  // products of the codes); z must hold n elements.
  void row(int64_t i, int64_t n, std::vector<double>* z) const;

 private:
  int64_t s_q_, s_k_, d_;
  double zscale_;
  std::vector<double> q_, k_;
  const float* qf_;
  const float* kf_;
};

}  // namespace fp4attn::golden
