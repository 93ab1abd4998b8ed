// Host side of the forward engine: validation, TMA descriptors, launch
// (attention_forward_operands_cuda), and the convenience entry that quantizes
// first (attention_forward_cuda).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/fwd/launch.cuh"
#include "cuda/fwd/setup.h"
#include "cuda/fwd/smooth_lse.h"
#include "cuda/quantize/operand_scratch.h"
#include "cuda/sm90/cuda_status.h"
#include "cuda/sm90/tensor_map.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "validate/validate_forward.h"

namespace fp4attn {
namespace {

using sm90::FwdParams;

using sm90::cuda_status;
using sm90::encode_tiled;
using sm90::EncodeTiledFn;

// A 3-D byte tensor (inner, mid, outer) read in boxes of (box_inner, box_mid, 1), as
// sm90::make_tiled_map_3d; the error names the operand.
Status make_map(CUtensorMap* map, const void* base, int64_t inner, int64_t mid, int64_t outer,
                int box_inner, int box_mid, const char* name) {
  const CUresult r = sm90::make_tiled_map_3d(map, base, inner, mid, outer, box_inner, box_mid);
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    return Status::Invalid("cuTensorMapEncodeTiled: not available in the driver");
  }
  if (r != CUDA_SUCCESS) {
    return Status::Invalid(std::string(name) + ": cannot build its TMA descriptor (CUresult " +
                           std::to_string(int(r)) + ")");
  }
  return Status::Ok();
}

// O (b, s_q, h, d) as a TMA store target: 2-byte elements, (d, s_q, h, b) with byte strides that
// TMA accepts (multiples of 16, base 16-byte aligned); 64 x 64 boxes, 128-byte swizzle. Returns
// false when O's layout does not allow it (the kernel then stores from registers).
bool make_out_map(CUtensorMap* map, const TensorView& o) {
  EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return false;
  const int64_t sb = o.stride[0] * 2, ss = o.stride[1] * 2, sh = o.stride[2] * 2;
  if (reinterpret_cast<uintptr_t>(o.data) % 16 || ss % 16 || sh % 16 || sb % 16) return false;
  const cuuint64_t dims[4] = {cuuint64_t(o.shape[3]), cuuint64_t(o.shape[1]),
                              cuuint64_t(o.shape[2]), cuuint64_t(o.shape[0])};
  const cuuint64_t strides[3] = {cuuint64_t(ss), cuuint64_t(sh), cuuint64_t(sb)};
  const cuuint32_t box[4] = {64, 64, 1, 1};
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, o.data, dims, strides, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

namespace sm90 {

Status set_forward_smem(const void* kernel, int bytes) {
  return cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
      "fwd kernel shared memory");
}

Status forward_grid(const FwdParams& p, dim3* grid) {
  // Persistent: one CTA per SM at most (the kernel walks the tiles).
  int dev = 0, sms = 0;
  FP4ATTN_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "device"));
  FP4ATTN_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "device"));
  const int64_t tiles = int64_t(p.m_tiles) * p.h * p.b;
  *grid = dim3(unsigned(std::min<int64_t>(tiles, sms)));
  return Status::Ok();
}

Status make_forward_params(const ForwardOperands& in, const ForwardOptions& opt,
                           const ForwardShape& sh, const TensorView& o, const TensorView& lse,
                           const TensorView& row_max, int n, FwdParams* out) {
  FwdParams p{};
  const int d = int(sh.d);
  // s_k = 0 gives rows without keys: the kernel then loads nothing, but the
  // maps must still be valid descriptors, so they get extent 1 over q_data.
  const bool no_keys = sh.s_k == 0;
  const int64_t s_k1 = no_keys ? 1 : sh.s_k;
  const void* k_base = no_keys ? in.q_data.data : in.k_data.data;
  const void* v_base = no_keys ? in.q_data.data : in.v_data.data;
  const int64_t v_pitch = no_keys ? 16 : operand_v_pitch(sh.s_k);
  FP4ATTN_RETURN_IF_ERROR(
      make_map(&p.tm_q, in.q_data.data, d, sh.s_q, sh.b * sh.h, d, kBlockM, "q_data"));
  FP4ATTN_RETURN_IF_ERROR(
      make_map(&p.tm_k, k_base, d, s_k1, no_keys ? 1 : sh.b * sh.h_kv, d, n, "k_data"));
  FP4ATTN_RETURN_IF_ERROR(make_map(&p.tm_v, v_base, v_pitch, no_keys ? 1 : d,
                                   no_keys ? 1 : sh.b * sh.h_kv, kScaleTile, d, "v_data"));
  p.q_scale = in.q_scale.as<float>();
  p.k_scale = in.k_scale.as<float>();
  p.v_scale = in.v_scale.as<float>();
  p.o = o.data;
  p.o_tma = make_out_map(&p.tm_o, o) ? 1 : 0;
  p.o_stride_b = o.stride[0];
  p.o_stride_s = o.stride[1];
  p.o_stride_h = o.stride[2];
  p.lse = lse.defined() ? lse.as<float>() : nullptr;
  p.lse_stride_b = lse.defined() ? lse.stride[0] : 0;
  p.lse_stride_h = lse.defined() ? lse.stride[1] : 0;
  p.row_max = row_max.defined() ? row_max.as<float>() : nullptr;
  p.row_max_stride_b = row_max.defined() ? row_max.stride[0] : 0;
  p.row_max_stride_h = row_max.defined() ? row_max.stride[1] : 0;
  p.b = int(sh.b);
  p.h = int(sh.h);
  p.h_kv = int(sh.h_kv);
  p.s_q = int(sh.s_q);
  p.s_k = int(sh.s_k);
  p.m_tiles = int(operand_scale_tiles(sh.s_q));
  p.n_tiles = int(operand_scale_tiles(sh.s_k));
  const double scale = opt.softmax_scale > 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(d));
  p.scale_log2 = float(scale * 1.4426950408889634);
  p.causal = opt.causal ? 1 : 0;
  p.out_fp16 = o.dtype == DType::kF16 ? 1 : 0;
  *out = p;
  return Status::Ok();
}

}  // namespace sm90

Status check_forward_device() {
  int dev = 0;
  FP4ATTN_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "device"));
  int major = 0, minor = 0;
  FP4ATTN_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "device"));
  FP4ATTN_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "device"));
  if (major != 9 || minor != 0) {
    return Status::Invalid(
        "device: the forward engine needs an sm_90a GPU (H100/H200), this is "
        "compute capability " +
        std::to_string(major) + "." + std::to_string(minor));
  }
  return Status::Ok();
}

Status attention_forward_operands_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                       const TensorView& o, const TensorView& lse,
                                       cudaStream_t stream, const TensorView& row_max) {
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_operands(in, opt, o, lse, &sh));
  if (row_max.defined()) FP4ATTN_RETURN_IF_ERROR(check_row_stats(row_max, "row_max", sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.b == 0 || sh.h == 0 || sh.s_q == 0) return Status::Ok();

  if (recipe_qk_is_int8(opt.recipe)) {
    return sm90::forward_p_mode(opt.recipe) == sm90::kPCodes
               ? sm90::launch_forward<sm90::kPCodes, true>(in, opt, sh, o, lse, row_max, stream)
               : sm90::launch_forward<sm90::kPExp2, true>(in, opt, sh, o, lse, row_max, stream);
  }
  switch (sm90::forward_p_mode(opt.recipe)) {
    case sm90::kPCodes:
      return sm90::launch_forward<sm90::kPCodes>(in, opt, sh, o, lse, row_max, stream);
    case sm90::kPDirect:
      return sm90::launch_forward<sm90::kPDirect>(in, opt, sh, o, lse, row_max, stream);
    case sm90::kPAll:
      return sm90::launch_forward<sm90::kPAll>(in, opt, sh, o, lse, row_max, stream);
    default:
      return sm90::launch_forward<sm90::kPExp2>(in, opt, sh, o, lse, row_max, stream);
  }
}

Status attention_forward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                              const ForwardOptions& opt, const TensorView& o, const TensorView& lse,
                              cudaStream_t stream, const TensorView& row_max) {
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, opt, o, lse, &sh));
  if (row_max.defined()) FP4ATTN_RETURN_IF_ERROR(check_row_stats(row_max, "row_max", sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.b == 0 || sh.h == 0 || sh.s_q == 0) return Status::Ok();

  return with_quantized_operands(
      q, k, v, opt, sh, stream, [&](const ForwardOperands& in, const TensorView& k_mean) {
        FP4ATTN_RETURN_IF_ERROR(attention_forward_operands_cuda(in, opt, o, lse, stream, row_max));
        if (!k_mean.defined() || !lse.defined() || sh.s_k == 0) return Status::Ok();
        const double scale =
            opt.softmax_scale > 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(sh.d));
        return sm90::add_smooth_k_lse(q, k_mean, scale, lse, stream);
      });
}

Status attention_forward_varlen_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                     int64_t batch, const ForwardOptions& opt, const TensorView& o,
                                     const TensorView& lse, cudaStream_t stream) {
  FP4ATTN_RETURN_IF_ERROR(
      validate_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, opt, o, lse));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  const int64_t h = q.shape[1], h_kv = k.shape[1], d = q.shape[2];
  const int es = dtype_size(q.dtype);
  // Sequence i as a batch of one: strided views into the packed tensors.
  auto slice = [&](const TensorView& t, int64_t start, int64_t len, int64_t heads) {
    return make_strided_view(static_cast<uint8_t*>(t.data) + start * t.stride[0] * es, t.dtype,
                             {1, len, heads, d}, {len * t.stride[0], t.stride[0], t.stride[1], 1});
  };
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t q0 = cu_seqlens_q[i], sq = cu_seqlens_q[i + 1] - q0;
    const int64_t k0 = cu_seqlens_k[i], sk = cu_seqlens_k[i + 1] - k0;
    if (sq == 0) continue;
    TensorView lse_i;
    if (lse.defined()) {
      lse_i = make_strided_view(lse.as<float>() + q0 * lse.stride[1], DType::kF32, {1, h, sq},
                                {h * lse.stride[0], lse.stride[0], lse.stride[1]});
    }
    const Status st =
        attention_forward_cuda(slice(q, q0, sq, h), slice(k, k0, sk, h_kv), slice(v, k0, sk, h_kv),
                               opt, slice(o, q0, sq, h), lse_i, stream);
    if (!st.ok()) return Status::Invalid("sequence " + std::to_string(i) + ": " + st.message());
  }
  return Status::Ok();
}

}  // namespace fp4attn
