// Host side of the GPU backward: validation (src/validate/validate_backward.cc), workspace from the
// stream-ordered allocator, and the kernel sequence of docs/kernels/bwd_sm90.md:
//   prep_rows (D, amax of dO) -> prep_quant (FP8 dO, Q^T) -> main, D_hp pass (only for
//   DSource::kHighPrecisionO) -> main, gradient pass (dK, dV, dQ accumulator) -> dq_convert.
#include <cuda_runtime.h>

#include <cmath>
#include <numbers>
#include <string>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/kernels.h"
#include "cuda/fwd/p_mode.h"
#include "cuda/quantize/operand_scratch.h"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/attention_bwd_cuda.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "validate/validate_backward.h"

namespace fp4attn {
namespace {

using bwd::BwdParams;

using sm90::cuda_status;

int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

void bshd_strides(const TensorView& t, int64_t (&s)[3]) {
  s[0] = t.stride[0];
  s[1] = t.stride[1];
  s[2] = t.stride[2];
}

Status run_backward(const ForwardOperands& in, const ForwardOptions& opt, const TensorView& o,
                    const TensorView& lse, const TensorView& dout, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, const BackwardCudaOptions& bopt,
                    const TensorView& row_max, const ForwardShape& sh, cudaStream_t stream) {
  if (sh.b == 0 || sh.h == 0 || (sh.s_q == 0 && sh.s_k == 0)) return Status::Ok();
  BwdParams p{};
  p.q = in.q_data.as<uint8_t>();
  p.k = in.k_data.as<uint8_t>();
  p.vt = in.v_data.as<uint8_t>();
  p.q_scale = in.q_scale.as<float>();
  p.k_scale = in.k_scale.as<float>();
  p.v_scale = in.v_scale.as<float>();
  p.o = o.as<uint16_t>();
  p.dout = dout.as<uint16_t>();
  bshd_strides(o, p.o_stride);
  bshd_strides(dout, p.do_stride);
  p.o_f16 = o.dtype == DType::kF16;
  p.do_f16 = dout.dtype == DType::kF16;
  p.lse = lse.as<float>();
  p.lse_stride[0] = lse.stride[0];
  p.lse_stride[1] = lse.stride[1];
  p.p_mode = sm90::backward_p_mode(opt.recipe);
  if (backward_needs_row_max(opt.recipe)) {
    p.row_max = row_max.as<float>();
    p.row_max_stride[0] = row_max.stride[0];
    p.row_max_stride[1] = row_max.stride[1];
  }
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  bshd_strides(dq, p.dq_stride);
  bshd_strides(dk, p.dk_stride);
  bshd_strides(dv, p.dv_stride);
  p.dq_f32 = dq.dtype == DType::kF32;
  p.dk_f32 = dk.dtype == DType::kF32;
  p.dv_f32 = dv.dtype == DType::kF32;
  p.b = int(sh.b);
  p.h = int(sh.h);
  p.h_kv = int(sh.h_kv);
  p.s_q = int(sh.s_q);
  p.s_k = int(sh.s_k);
  p.s_q_pad = int(bwd::padded_queries(sh.s_q));
  p.vt_pitch = int(operand_v_pitch(sh.s_k));
  p.key_blocks = int((sh.s_k + bwd::kKeyBlock - 1) / bwd::kKeyBlock);
  const double scale = opt.softmax_scale > 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(sh.d));
  p.softmax_scale = float(scale);
  p.scale_log2 = float(scale * std::numbers::log2e);
  p.causal = opt.causal;
  p.deterministic = bopt.deterministic;
  const bool hp = bopt.d_source == DSource::kHighPrecisionO;

  // Workspace, one stream-ordered allocation.
  const int64_t bh = sh.b * sh.h, d = sh.d;
  const int64_t n_dsum = 4 * bh * sh.s_q, n_amax = 4 * bh * bwd::kAmaxSlots;
  const int64_t n_fp8 = bh * p.s_q_pad * d;
  // dq_turn: one counter per (b, h, 64-query block, consumer warpgroup).
  const int64_t n_acc = 4 * bh * sh.s_q * d, n_turn = 4 * bh * (p.s_q_pad / bwd::kQueryBlock) * 2;
  // D_hp and its turns (64-query blocks), only with DSource::kHighPrecisionO.
  const int64_t n_hp = hp ? n_dsum : 0;
  const int64_t n_hp_turn = hp && p.deterministic ? 4 * bh * (p.s_q_pad / bwd::kQueryBlock) : 0;
  const int64_t bytes = round256(n_dsum) + round256(n_amax) + 3 * round256(n_fp8) +
                        round256(n_acc) + round256(n_turn) + round256(n_hp) + round256(n_hp_turn);
  void* ws = nullptr;
  FP4ATTN_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&ws, size_t(bytes), stream), "backward workspace"));
  uint8_t* cur = static_cast<uint8_t*>(ws);
  auto take = [&](int64_t n) {
    uint8_t* r = cur;
    cur += round256(n);
    return r;
  };
  p.dsum = reinterpret_cast<float*>(take(n_dsum));
  p.amax = reinterpret_cast<float*>(take(n_amax));
  p.do_v = take(n_fp8);
  p.do_t = take(n_fp8);
  p.q_t = take(n_fp8);
  p.dq_acc = reinterpret_cast<float*>(take(n_acc));
  p.dq_turn = reinterpret_cast<int*>(take(n_turn));
  p.dsum_hp = hp ? reinterpret_cast<float*>(take(n_hp)) : nullptr;
  p.dsum_hp_turn = n_hp_turn > 0 ? reinterpret_cast<int*>(take(n_hp_turn)) : nullptr;

  const int di = int(d);
  cudaError_t e = cudaMemsetAsync(p.amax, 0, size_t(n_amax), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(p.dq_acc, 0, size_t(n_acc), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(p.dq_turn, 0, size_t(n_turn), stream);
  if (e == cudaSuccess && n_hp > 0) e = cudaMemsetAsync(p.dsum_hp, 0, size_t(n_hp), stream);
  if (e == cudaSuccess && n_hp_turn > 0) {
    e = cudaMemsetAsync(p.dsum_hp_turn, 0, size_t(n_hp_turn), stream);
  }
  if (e == cudaSuccess) e = bwd::launch_prep_rows(p, di, stream);
  if (e == cudaSuccess) e = bwd::launch_prep_quant(p, di, stream);
  // dS is scaled per tile inside the gradient pass (golden DsScales::kPerTile) and dQ summed in
  // real units, so only kHighPrecisionO needs a pass before it: the D_hp pass, whose D_hp the
  // gradient pass takes as its D.
  BwdParams pg = p;
  if (hp) pg.dsum = p.dsum_hp;
  pg.dsum_hp = nullptr;
  pg.dsum_hp_turn = nullptr;
  if (e == cudaSuccess && sh.s_q > 0 && hp) e = bwd::launch_main(p, di, true, stream);
  if (e == cudaSuccess && sh.s_q > 0) e = bwd::launch_main(pg, di, false, stream);
  if (e == cudaSuccess) e = bwd::launch_dq_convert(p, di, stream);
  Status st = cuda_status(e, "backward kernels");
  const cudaError_t fe = cudaFreeAsync(ws, stream);
  if (st.ok()) st = cuda_status(fe, "backward workspace");
  return st;
}

// dK/dV when no query exists (s_q = 0): zero, as the golden model's.
Status zero_kv_grads(const TensorView& dk, const TensorView& dv, cudaStream_t stream) {
  for (const TensorView* t : {&dk, &dv}) {
    if (t->numel() == 0) continue;
    if (!t->is_contiguous()) {
      return Status::Unsupported("dk/dv: s_q = 0 needs contiguous gradients to zero them");
    }
    FP4ATTN_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(t->data, 0, size_t(t->numel()) * dtype_size(t->dtype), stream),
                    "zeroing dk/dv"));
  }
  return Status::Ok();
}

}  // namespace

Status attention_backward_operands_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                        const TensorView& o, const TensorView& lse,
                                        const TensorView& dout, const TensorView& dq,
                                        const TensorView& dk, const TensorView& dv,
                                        const BackwardCudaOptions& bopt, cudaStream_t stream,
                                        const TensorView& row_max) {
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_backward_operands(in, opt, o, lse, dout, dq, dk, dv, &sh));
  FP4ATTN_RETURN_IF_ERROR(validate_backward_options(bopt));
  FP4ATTN_RETURN_IF_ERROR(validate_backward_row_max(opt, row_max, sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.s_q == 0) return zero_kv_grads(dk, dv, stream);
  return run_backward(in, opt, o, lse, dout, dq, dk, dv, bopt, row_max, sh, stream);
}

Status attention_backward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse, const TensorView& dout, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const BackwardCudaOptions& bopt, cudaStream_t stream,
                               const TensorView& row_max) {
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_backward_inputs(q, k, v, opt, o, lse, dout, dq, dk, dv, &sh));
  FP4ATTN_RETURN_IF_ERROR(validate_backward_options(bopt));
  FP4ATTN_RETURN_IF_ERROR(validate_backward_row_max(opt, row_max, sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.s_q == 0) return zero_kv_grads(dk, dv, stream);
  if (sh.b == 0 || sh.h == 0) return Status::Ok();

  // The forward's operands again (same quantizers, same bytes).
  return with_quantized_operands(
      q, k, v, opt, sh, stream, [&](const ForwardOperands& in, const TensorView&) {
        return run_backward(in, opt, o, lse, dout, dq, dk, dv, bopt, row_max, sh, stream);
      });
}

}  // namespace fp4attn
