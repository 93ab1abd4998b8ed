#include "reference/golden_operand_scores.h"

#include "core/half.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"

namespace fp4attn::golden {

double operand_code_value(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kBF16) return bf16_bits_to_float(t.as<const uint16_t>()[i]);
  if (t.dtype == DType::kI8) return t.as<const int8_t>()[i];
  return e4m3_to_float(t.as<const uint8_t>()[i]);
}

OperandScores::OperandScores(const ForwardOperands& in, int64_t bi, int64_t hi, double zscale)
    : s_q_(in.q_data.shape[2]), s_k_(in.k_data.shape[2]), d_(in.q_data.shape[3]), zscale_(zscale) {
  const int64_t h = in.q_data.shape[1], h_kv = in.k_data.shape[1];
  const int64_t q_head = bi * h + hi, kv_head = bi * h_kv + hi / (h / h_kv);
  q_.resize(s_q_ * d_);
  k_.resize(s_k_ * d_);
  for (int64_t i = 0; i < s_q_ * d_; ++i)
    q_[i] = operand_code_value(in.q_data, q_head * s_q_ * d_ + i);
  for (int64_t i = 0; i < s_k_ * d_; ++i)
    k_[i] = operand_code_value(in.k_data, kv_head * s_k_ * d_ + i);
  qf_ = in.q_scale.as<const float>() + q_head * operand_scale_tiles(s_q_);
  kf_ = in.k_scale.as<const float>() + kv_head * operand_scale_tiles(s_k_);
}

void OperandScores::row(int64_t i, int64_t n, std::vector<double>* z) const {
  const double* qi = &q_[i * d_];
  const double q_factor = qf_[i / kOperandTileTokens];
  for (int64_t j = 0; j < n; ++j) {
    const double* kj = &k_[j * d_];
    double s = 0;
    for (int64_t c = 0; c < d_; ++c) s += qi[c] * kj[c];
    (*z)[j] = s * q_factor * double(kf_[j / kOperandTileTokens]) * zscale_;
  }
}

}  // namespace fp4attn::golden
