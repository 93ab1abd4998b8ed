#include <cuda_runtime.h>

#include <string>

#include "cuda/quantize/operand_scratch.h"
#include "fp4attn/operands.h"
#include "fp4attn/operands_cuda.h"

namespace fp4attn {

Status with_quantized_operands(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const ForwardShape& sh,
                               cudaStream_t stream, const OperandUse& use) {
  const int64_t qd = sh.b * sh.h * sh.s_q * sh.d;
  const int64_t kd = sh.b * sh.h_kv * sh.s_k * sh.d;
  const int64_t vd = sh.b * sh.h_kv * sh.d * operand_v_pitch(sh.s_k);
  const int64_t qs = sh.b * sh.h * operand_scale_tiles(sh.s_q);
  const int64_t ks = sh.b * sh.h_kv * operand_scale_tiles(sh.s_k);
  const int64_t vs = sh.b * sh.h_kv * sh.d;
  const bool smooth = recipe_smooths_k(opt.recipe);
  const int64_t ms = smooth ? sh.b * sh.h_kv * sh.d : 0;
  auto round256 = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t bytes = round256(qd) + round256(kd) + round256(vd) + round256(4 * qs) +
                        round256(4 * ks) + round256(4 * vs) + round256(4 * ms);
  void* scratch = nullptr;
  const cudaError_t a = cudaMallocAsync(&scratch, size_t(bytes), stream);
  if (a != cudaSuccess) {
    return Status::Invalid(std::string("operand scratch: CUDA error ") + cudaGetErrorString(a));
  }
  uint8_t* cur = static_cast<uint8_t*>(scratch);
  auto take = [&](int64_t n) {
    void* r = cur;
    cur += round256(n);
    return r;
  };
  ForwardOperands in;
  const DType qk_type = operand_data_dtype(opt.recipe, OperandRole::kQ);
  in.q_data = make_view(take(qd), qk_type, {sh.b, sh.h, sh.s_q, sh.d});
  in.k_data = make_view(take(kd), qk_type, {sh.b, sh.h_kv, sh.s_k, sh.d});
  in.v_data = make_view(take(vd), DType::kE4M3, {sh.b, sh.h_kv, sh.d, operand_v_pitch(sh.s_k)});
  in.q_scale = make_view(take(4 * qs), DType::kF32, {sh.b, sh.h, operand_scale_tiles(sh.s_q)});
  in.k_scale = make_view(take(4 * ks), DType::kF32, {sh.b, sh.h_kv, operand_scale_tiles(sh.s_k)});
  in.v_scale = make_view(take(4 * vs), DType::kF32, {sh.b, sh.h_kv, sh.d});
  TensorView k_mean;
  if (smooth) k_mean = make_view(take(4 * ms), DType::kF32, {sh.b, sh.h_kv, sh.d});
  Status st =
      quantize_operand_cuda(q, opt.recipe, OperandRole::kQ, {}, in.q_data, in.q_scale, {}, stream);
  if (st.ok() && sh.s_k > 0) {
    st = quantize_operand_cuda(k, opt.recipe, OperandRole::kK, {}, in.k_data, in.k_scale, k_mean,
                               stream);
  }
  if (st.ok() && sh.s_k > 0) {
    st = quantize_operand_cuda(v, opt.recipe, OperandRole::kV, {}, in.v_data, in.v_scale, {},
                               stream);
  }
  if (st.ok()) st = use(in, k_mean);
  const cudaError_t e = cudaFreeAsync(scratch, stream);
  if (st.ok() && e != cudaSuccess) {
    st = Status::Invalid(std::string("operand scratch: CUDA error ") + cudaGetErrorString(e));
  }
  return st;
}

}  // namespace fp4attn
