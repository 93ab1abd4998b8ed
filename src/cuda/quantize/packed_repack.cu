// Repack of packed storage into kernel operands (repack_to_operand_cuda, quantize_cuda.h).
//
// Bit-exact folds (no requantization), one thread per scale block:
//   NVFP4 Q/K: E4M3_RNE(e2m1 * scale / 8) (both products exact in FP32), factor 8 / s_enc;
//   MXFP4 Q/K: E4M3(e2m1 * 2^(e - t)), t = max block exponent of the (b, h) slice - 6 (NaN blocks
//              excluded; first pass: an atomicMax per block into a stream-ordered scratch),
//              factor 2^t.
// NaN blocks give 0x7F, as float_to_e4m3 of the golden model's NaN values.
// Every other combination dequantizes to BF16 and calls quantize_operand_cuda.
// The kernels are in packed_repack_kernels.cuh.
#include <cuda_runtime.h>

#include <string>

#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/packed_internal.h"
#include "cuda/quantize/packed_repack_kernels.cuh"
#include "cuda/quantize/row_map.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"
#include "validate/validate_cuda.h"

namespace fp4attn {
namespace {

using packed::FastDiv;
using packed::repack::kThreads;
using packed::repack::RepackParams;

bool is_nvfp4_qk_recipe(Recipe r) {
  return r == Recipe::kNvfp4 || r == Recipe::kNvfp4Hx || r == Recipe::kNvfp4Fast ||
         r == Recipe::kNvfp4All || r == Recipe::kFp4Direct;
}

Status repack_via_bf16(const PackedTensor& in, Recipe recipe, OperandRole role,
                       const OperandOptions& opt, const TensorView& data, const TensorView& scale,
                       const TensorView& mean, int64_t b, int64_t s, int64_t h, int64_t d,
                       cudaStream_t stream) {
  const int64_t n = b * s * h * d;
  void* tmp = nullptr;
  if (n > 0 && cudaMallocAsync(&tmp, static_cast<size_t>(n) * 2, stream) != cudaSuccess) {
    return packed::launch_status("repack_to_operand_cuda (scratch)");
  }
  const TensorView x = make_view(tmp, DType::kBF16, {b, s, h, d});
  Status st = dequantize_packed_cuda(in, x, stream);
  if (st.ok()) st = quantize_operand_cuda(x, recipe, role, opt, data, scale, mean, stream);
  if (tmp != nullptr) cudaFreeAsync(tmp, stream);
  return st;
}

}  // namespace

Status repack_to_operand_cuda(const PackedTensor& in, Recipe recipe, OperandRole role,
                              const OperandOptions& opt, const TensorView& data,
                              const TensorView& scale, const TensorView& mean,
                              cudaStream_t stream) {
  int64_t b, s, h, d;
  FP4ATTN_RETURN_IF_ERROR(packed::check_packed(in, &b, &s, &h, &d));
  const bool qk = role == OperandRole::kQ || role == OperandRole::kK;
  const bool nv = in.format == PackedFormat::kNvfp4;
  const bool fold = qk && !opt.smooth_k &&
                    ((nv && is_nvfp4_qk_recipe(recipe)) || (!nv && recipe == Recipe::kMxfp4));
  if (!fold) return repack_via_bf16(in, recipe, role, opt, data, scale, mean, b, s, h, d, stream);
  if (mean.defined()) {
    return Status::Invalid("mean: must be undefined (opt.smooth_k is false)");
  }
  const int64_t tiles = operand_scale_tiles(s);
  FP4ATTN_RETURN_IF_ERROR(cuda_check::output(data, "data", {b, h, s, d}, {DType::kE4M3}, 16));
  FP4ATTN_RETURN_IF_ERROR(cuda_check::output(scale, "scale", {b, h, tiles}, {DType::kF32}, 4));
  const int64_t rows = b * s * h;
  const int64_t block = nv ? kNvfp4Block : kMxfp4Block;
  RepackParams p;
  p.packed = static_cast<const uint8_t*>(in.packed.data);
  p.scales = static_cast<const uint8_t*>(in.scales.data);
  p.blocks = rows * (d / block);
  p.sf_cols = d / block;
  p.block = block;
  p.d = d;
  p.s = s;
  p.h = h;
  p.div_sf_cols = FastDiv::make(static_cast<uint64_t>(p.sf_cols > 0 ? p.sf_cols : 1));
  p.div_h = FastDiv::make(static_cast<uint64_t>(h > 0 ? h : 1));
  p.div_s = FastDiv::make(static_cast<uint64_t>(s > 0 ? s : 1));
  p.swizzled = in.layout == ScaleLayout::kSwizzled128x4;
  p.data = static_cast<uint8_t*>(data.data);
  p.slice_max = nullptr;
  p.scale = scale.as<float>();
  p.tiles = tiles;
  p.s_enc = in.s_enc;
  p.s_enc_ptr = in.s_enc_device;
  const int64_t n_scale = b * h * tiles;
  if (n_scale == 0) return Status::Ok();  // no (b, h) slice or no token: nothing to write
  if (!nv) {
    void* tmp = nullptr;
    if (cudaMallocAsync(&tmp, static_cast<size_t>(b * h) * sizeof(unsigned), stream) !=
            cudaSuccess ||
        cudaMemsetAsync(tmp, 0, static_cast<size_t>(b * h) * sizeof(unsigned), stream) !=
            cudaSuccess) {
      return packed::launch_status("repack_to_operand_cuda (scratch)");
    }
    p.slice_max = static_cast<unsigned*>(tmp);
  }
  const int grid = packed::grid_for(p.blocks, kThreads);
  if (nv) {
    if (p.blocks > 0) packed::repack::nvfp4_fold_kernel<<<grid, kThreads, 0, stream>>>(p);
  } else if (p.blocks > 0) {
    packed::repack::mxfp4_slice_max_kernel<<<grid, kThreads, 0, stream>>>(p);
    packed::repack::mxfp4_fold_kernel<<<grid, kThreads, 0, stream>>>(p);
  }
  packed::repack::factor_kernel<<<packed::grid_for(n_scale, 256, 2), 256, 0, stream>>>(p, n_scale,
                                                                                       nv);
  if (p.slice_max != nullptr) cudaFreeAsync(p.slice_max, stream);
  return packed::launch_status("repack_to_operand_cuda");
}

}  // namespace fp4attn
