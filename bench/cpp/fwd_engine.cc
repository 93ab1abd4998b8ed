#include "fwd_engine.h"

#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "fwd_bound.h"

namespace fp4attn::bench {

FwdProblem::FwdProblem(const FwdPoint& p, Recipe recipe, const void* q, const void* k,
                       const void* v, bool bound)
    : p_(p), recipe_(recipe), bound_(bound) {
  // The views are const in spirit: the quantizers only read them.
  xq_ = make_view(const_cast<void*>(q), DType::kBF16, {p.b, p.s_q, p.h, p.d});
  xk_ = make_view(const_cast<void*>(k), DType::kBF16, {p.b, p.s_k, p.h_kv, p.d});
  xv_ = make_view(const_cast<void*>(v), DType::kBF16, {p.b, p.s_k, p.h_kv, p.d});
}

namespace {
size_t bytes(int64_t n, DType t) { return static_cast<size_t>(n) * dtype_size(t); }
}  // namespace

Status FwdProblem::prepare() {
  const DType dt = operand_data_dtype(recipe_, OperandRole::kQ);
  const int64_t pitch = operand_v_pitch(p_.s_k);
  q_data_ = DeviceBuffer(bytes(p_.b * p_.h * p_.s_q * p_.d, dt));
  q_scale_ = DeviceBuffer(4 * static_cast<size_t>(p_.b * p_.h * operand_scale_tiles(p_.s_q)));
  k_data_ = DeviceBuffer(bytes(p_.b * p_.h_kv * p_.s_k * p_.d, dt));
  k_scale_ = DeviceBuffer(4 * static_cast<size_t>(p_.b * p_.h_kv * operand_scale_tiles(p_.s_k)));
  v_data_ = DeviceBuffer(
      bytes(p_.b * p_.h_kv * p_.d * pitch, operand_data_dtype(recipe_, OperandRole::kV)));
  if (recipe_smooths_k(recipe_))
    k_mean_ = DeviceBuffer(4 * static_cast<size_t>(p_.b * p_.h_kv * p_.d));
  v_scale_ = DeviceBuffer(4 * static_cast<size_t>(p_.b * p_.h_kv * p_.d));
  o_ = DeviceBuffer(2 * static_cast<size_t>(p_.b * p_.s_q * p_.h * p_.d));
  return Status::Ok();
}

Status FwdProblem::quantize(OperandRole role, cudaStream_t stream) const {
  const DType dt = operand_data_dtype(recipe_, role);
  // Computed NVFP4 scales, K smoothed only where the recipe always smooths: the engine's defaults.
  const OperandOptions opt;
  const TensorView k_mean = recipe_smooths_k(recipe_)
                                ? make_view(k_mean_.get(), DType::kF32, {p_.b, p_.h_kv, p_.d})
                                : TensorView{};
  switch (role) {
    case OperandRole::kQ:
      return quantize_operand_cuda(
          xq_, recipe_, role, opt, make_view(q_data_.get(), dt, {p_.b, p_.h, p_.s_q, p_.d}),
          make_view(q_scale_.get(), DType::kF32, {p_.b, p_.h, operand_scale_tiles(p_.s_q)}),
          TensorView{}, stream);
    case OperandRole::kK:
      return quantize_operand_cuda(
          xk_, recipe_, role, opt, make_view(k_data_.get(), dt, {p_.b, p_.h_kv, p_.s_k, p_.d}),
          make_view(k_scale_.get(), DType::kF32, {p_.b, p_.h_kv, operand_scale_tiles(p_.s_k)}),
          k_mean, stream);
    case OperandRole::kV:
      return quantize_operand_cuda(
          xv_, recipe_, role, opt,
          make_view(v_data_.get(), dt, {p_.b, p_.h_kv, p_.d, operand_v_pitch(p_.s_k)}),
          make_view(v_scale_.get(), DType::kF32, {p_.b, p_.h_kv, p_.d}), TensorView{}, stream);
  }
  return Status::Invalid("bench: unknown operand role");
}

Status FwdProblem::forward(cudaStream_t stream) const {
  const DType dt = operand_data_dtype(recipe_, OperandRole::kQ);
  ForwardOperands in;
  in.q_data = make_view(q_data_.get(), dt, {p_.b, p_.h, p_.s_q, p_.d});
  in.q_scale = make_view(q_scale_.get(), DType::kF32, {p_.b, p_.h, operand_scale_tiles(p_.s_q)});
  in.k_data = make_view(k_data_.get(), dt, {p_.b, p_.h_kv, p_.s_k, p_.d});
  in.k_scale = make_view(k_scale_.get(), DType::kF32, {p_.b, p_.h_kv, operand_scale_tiles(p_.s_k)});
  in.v_data = make_view(v_data_.get(), operand_data_dtype(recipe_, OperandRole::kV),
                        {p_.b, p_.h_kv, p_.d, operand_v_pitch(p_.s_k)});
  in.v_scale = make_view(v_scale_.get(), DType::kF32, {p_.b, p_.h_kv, p_.d});
  ForwardOptions opt;
  opt.recipe = recipe_;
  opt.causal = p_.causal;
  const TensorView o = make_view(o_.get(), DType::kBF16, {p_.b, p_.s_q, p_.h, p_.d});
  if (bound_) return forward_bound_operands(in, opt, o, stream);
  return attention_forward_operands_cuda(in, opt, o, TensorView{}, stream);
}

}  // namespace fp4attn::bench
