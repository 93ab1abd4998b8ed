// Packed NVFP4 / MXFP4 quantizers (quantize_cuda.h): BF16/FP16 BSHD -> two E2M1 per byte +
// block scales, row-major or 128x4-swizzled. This file checks the arguments and launches the
// kernels of packed_quantize_kernels.cuh.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/packed_internal.h"
#include "cuda/quantize/packed_quantize_kernels.cuh"
#include "cuda/quantize/row_map.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"
#include "validate/validate_cuda.h"

namespace fp4attn {
namespace {

using packed::FastDiv;
using packed::quant::kThreads;
using packed::quant::kUnit;
using packed::quant::QuantParams;

struct Shape {
  int64_t b, s, h, d, rows;
};

Shape shape_of(const TensorView& x) {
  return {x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[0] * x.shape[1] * x.shape[2]};
}

Status check_scales(const TensorView& scales, const Shape& sh, int64_t sf_cols, ScaleLayout layout,
                    std::initializer_list<DType> dtypes) {
  if (layout == ScaleLayout::kRowMajor) {
    return cuda_check::output(scales, "scales", {sh.b, sh.s, sh.h, sf_cols}, dtypes, 1);
  }
  const int64_t n = swizzled_scale_bytes(sh.rows, sf_cols);
  const int64_t rows_pad = (sh.rows + 127) / 128 * 128, cols_pad = (sf_cols + 3) / 4 * 4;
  return cuda_check::output_one_of(scales, "scales", {{n}, {rows_pad, cols_pad}}, dtypes, 1);
}

// Validation common to both formats; fills the parameters.
Status prepare(const TensorView& x, int block, ScaleLayout layout, const TensorView& packed_out,
               const TensorView& scales, std::initializer_list<DType> scale_dtypes, QuantParams* p,
               Shape* sh) {
  FP4ATTN_RETURN_IF_ERROR(cuda_check::bshd_input(x, "x", {DType::kBF16, DType::kF16}, 16));
  FP4ATTN_RETURN_IF_ERROR(cuda_check::head_dim_multiple(x, "x", block));
  *sh = shape_of(x);
  const int64_t sf_cols = sh->d / block;
  FP4ATTN_RETURN_IF_ERROR(
      cuda_check::output(packed_out, "packed", {sh->b, sh->s, sh->h, sh->d / 2}, {DType::kU8}, 16));
  FP4ATTN_RETURN_IF_ERROR(check_scales(scales, *sh, sf_cols, layout, scale_dtypes));
  p->x = static_cast<const uint8_t*>(x.data);
  p->blocks = sh->rows * sf_cols;
  p->units = (sh->rows * sh->d + kUnit - 1) / kUnit;
  p->sf_cols = sf_cols;
  p->div_sf_cols = FastDiv::make(static_cast<uint64_t>(sf_cols > 0 ? sf_cols : 1));
  p->div_h16 = FastDiv::make(static_cast<uint64_t>(sh->d >= 16 ? sh->d / 16 : 1));
  p->rows.div_h = FastDiv::make(static_cast<uint64_t>(sh->h > 0 ? sh->h : 1));
  p->rows.div_s = FastDiv::make(static_cast<uint64_t>(sh->s > 0 ? sh->s : 1));
  p->rows.stride_b = x.stride[0];
  p->rows.stride_s = x.stride[1];
  p->rows.stride_h = x.stride[2];
  p->contiguous = x.is_contiguous();
  p->swizzled = layout == ScaleLayout::kSwizzled128x4;
  p->packed = static_cast<uint8_t*>(packed_out.data);
  p->scales = static_cast<uint8_t*>(scales.data);
  p->scale_pairs = !p->swizzled && reinterpret_cast<uintptr_t>(scales.data) % 2 == 0;
  p->s_enc = 1.f;
  p->s_enc_ptr = nullptr;
  p->s_enc_out = nullptr;
  return Status::Ok();
}

void launch_padding(const QuantParams& p, int64_t rows, cudaStream_t stream) {
  if (!p.swizzled) return;
  const int64_t rows_pad = (rows + 127) / 128 * 128, cols_pad = (p.sf_cols + 3) / 4 * 4;
  const int64_t n = (rows_pad - rows) * cols_pad + rows * (cols_pad - p.sf_cols);
  if (n == 0) return;
  packed::quant::zero_swizzle_padding<<<packed::grid_for(n, 256, 2), 256, 0, stream>>>(
      p.scales, rows, p.sf_cols);
}

template <typename T, Nvfp4ScaleRule kRule>
void launch_nvfp4_rule(const QuantParams& p, cudaStream_t stream) {
  // Exactly the resident CTAs (no second, partly filled round of the grid-stride loop).
  const int grid = packed::grid_for(p.units, kThreads, packed::quant::nvfp4_min_ctas<T, kRule>());
  packed::quant::nvfp4_packed_kernel<T, kRule><<<grid, kThreads, 0, stream>>>(p);
  if (p.s_enc_ptr != nullptr || !packed::nvfp4_table_finite(p.s_enc)) {
    packed::quant::nvfp4_reference_kernel<T, kRule><<<grid, kThreads, 0, stream>>>(p);
  }
}

template <typename T>
void launch_nvfp4(const QuantParams& p, Nvfp4ScaleRule rule, cudaStream_t stream) {
  switch (rule) {
    case Nvfp4ScaleRule::kNearest:
      launch_nvfp4_rule<T, Nvfp4ScaleRule::kNearest>(p, stream);
      break;
    case Nvfp4ScaleRule::kRoundUp:
      launch_nvfp4_rule<T, Nvfp4ScaleRule::kRoundUp>(p, stream);
      break;
    case Nvfp4ScaleRule::kFourOverSix:
      launch_nvfp4_rule<T, Nvfp4ScaleRule::kFourOverSix>(p, stream);
      break;
    case Nvfp4ScaleRule::kRestricted:
      launch_nvfp4_rule<T, Nvfp4ScaleRule::kRestricted>(p, stream);
      break;
  }
}

template <typename T>
void launch_mxfp4(const QuantParams& p, MxScaleRule rule, cudaStream_t stream) {
  const int grid = packed::grid_for(p.units, kThreads);
  if (rule == MxScaleRule::kOcpFloor) {
    packed::quant::mxfp4_packed_kernel<T, MxScaleRule::kOcpFloor><<<grid, kThreads, 0, stream>>>(p);
  } else {
    packed::quant::mxfp4_packed_kernel<T, MxScaleRule::kRoundUp><<<grid, kThreads, 0, stream>>>(p);
  }
}

bool valid_rule(Nvfp4ScaleRule r) {
  return r == Nvfp4ScaleRule::kNearest || r == Nvfp4ScaleRule::kRoundUp ||
         r == Nvfp4ScaleRule::kFourOverSix || r == Nvfp4ScaleRule::kRestricted;
}

}  // namespace

Status quantize_packed_nvfp4_cuda(const TensorView& x, Nvfp4ScaleRule rule, float s_enc,
                                  ScaleLayout layout, const TensorView& packed,
                                  const TensorView& scales, const TensorView& s_enc_out,
                                  cudaStream_t stream) {
  if (!valid_rule(rule)) return Status::Invalid("rule: unknown Nvfp4ScaleRule");
  if (!std::isfinite(s_enc) || s_enc < 0.f) {
    return Status::Invalid("s_enc: must be finite and > 0, or 0 to compute it, got " +
                           std::to_string(s_enc));
  }
  QuantParams p;
  Shape sh;
  FP4ATTN_RETURN_IF_ERROR(
      prepare(x, kNvfp4Block, layout, packed, scales, {DType::kU8, DType::kE4M3}, &p, &sh));
  const bool compute = s_enc == 0.f;
  if (compute || s_enc_out.defined()) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::output(s_enc_out, "s_enc_out", {1}, {DType::kF32}, 4));
  }
  float* out = s_enc_out.defined() ? s_enc_out.as<float>() : nullptr;
  if (sh.rows * sh.d == 0) {
    if (out != nullptr) {  // the s_enc of an empty tensor: nvfp4_tensor_scale(0) = 1
      const float value = compute ? nvfp4_tensor_scale(0.f, rule) : s_enc;
      if (cudaMemcpyAsync(out, &value, sizeof(float), cudaMemcpyHostToDevice, stream) !=
          cudaSuccess) {
        return packed::launch_status("quantize_packed_nvfp4_cuda");
      }
    }
    launch_padding(p, sh.rows, stream);
    return packed::launch_status("quantize_packed_nvfp4_cuda");
  }
  if (compute) {
    if (cudaMemsetAsync(out, 0, sizeof(float), stream) != cudaSuccess) {
      return packed::launch_status("quantize_packed_nvfp4_cuda");
    }
    packed::launch_amax_bits(x, reinterpret_cast<uint32_t*>(out), stream);
    packed::quant::finalize_tensor_scale<<<1, 1, 0, stream>>>(out, rule);
    p.s_enc_ptr = out;
  } else {
    p.s_enc = s_enc;
    p.s_enc_out = out;
  }
  if (x.dtype == DType::kBF16) {
    launch_nvfp4<__nv_bfloat16>(p, rule, stream);
  } else {
    launch_nvfp4<__half>(p, rule, stream);
  }
  launch_padding(p, sh.rows, stream);
  return packed::launch_status("quantize_packed_nvfp4_cuda");
}

Status quantize_packed_mxfp4_cuda(const TensorView& x, MxScaleRule rule, ScaleLayout layout,
                                  const TensorView& packed, const TensorView& scales,
                                  cudaStream_t stream) {
  if (rule != MxScaleRule::kOcpFloor && rule != MxScaleRule::kRoundUp) {
    return Status::Invalid("rule: unknown MxScaleRule");
  }
  QuantParams p;
  Shape sh;
  FP4ATTN_RETURN_IF_ERROR(prepare(x, kMxfp4Block, layout, packed, scales, {DType::kU8}, &p, &sh));
  if (sh.rows * sh.d > 0) {
    if (x.dtype == DType::kBF16) {
      launch_mxfp4<__nv_bfloat16>(p, rule, stream);
    } else {
      launch_mxfp4<__half>(p, rule, stream);
    }
  }
  launch_padding(p, sh.rows, stream);
  return packed::launch_status("quantize_packed_mxfp4_cuda");
}

}  // namespace fp4attn
