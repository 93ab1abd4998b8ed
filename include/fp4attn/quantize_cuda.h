// GPU quantizers. Every byte they write equals the host codecs of quantize.h / scale_layout.h
// (docs/numerics.md §2-3): the kernels call the same FP4ATTN_HD functions, or fast paths tested
// equal to them. All pointers inside the TensorViews are device memory; work is queued on
// `stream` and nothing synchronizes. Bad input returns a Status naming the argument and launches
// nothing; empty tensors launch nothing and return Ok.
#pragma once

#include <cuda_runtime_api.h>

#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

// ==== Packed storage (issue 3, contract section B) ============================================
//
// x: BSHD [b, s, h, d] BF16 or FP16, last dim contiguous, other strides >= 0 and multiples of 8
// elements, data 16-byte aligned (the kernels load 8 values per 16-byte vector). x is viewed as
// rows = b * s * h rows of d values (row r = (bi * s + si) * h + hi), quantized in blocks along d
// (16 for NVFP4, 32 for MXFP4; d must be a multiple of the block).
// packed: U8 [b, s, h, d / 2], contiguous: two E2M1 codes per byte, element 2j in the low nibble.
// scales (E4M3 codes for NVFP4, dtype kU8 or kE4M3; E8M0 codes for MXFP4, dtype kU8), contiguous:
//   kRowMajor:       [b, s, h, d / block];
//   kSwizzled128x4:  [swizzled_scale_bytes(rows, d / block)] (rank 1), or rank 2
//                    [rows rounded up to 128, d / block rounded up to 4]; the Blackwell layout of
//                    scale_layout.h, padding bytes written as 0.
enum class ScaleLayout { kRowMajor, kSwizzled128x4 };

// NVFP4 with the per-tensor encode scale s_enc (decode x = e2m1 * scale / s_enc):
//   s_enc > 0 (finite): supplied (static, e.g. a checkpoint's); one pass over x.
//   s_enc == 0: computed on the device: nvfp4_tensor_scale(tensor_amax(x), rule) (two passes).
// s_enc_out: F32 [1] in device memory receiving the s_enc used; required when s_enc == 0,
// optional (TensorView{}) otherwise.
Status quantize_packed_nvfp4_cuda(const TensorView& x, Nvfp4ScaleRule rule, float s_enc,
                                  ScaleLayout layout, const TensorView& packed,
                                  const TensorView& scales, const TensorView& s_enc_out,
                                  cudaStream_t stream);

Status quantize_packed_mxfp4_cuda(const TensorView& x, MxScaleRule rule, ScaleLayout layout,
                                  const TensorView& packed, const TensorView& scales,
                                  cudaStream_t stream);

// NaN-propagating max |x| over the whole tensor (x as above), written as one FP32 to device
// memory: NaN if any element is NaN, else +Inf if any is +-Inf, else the max (0 for an empty x).
Status tensor_amax_cuda(const TensorView& x, float* amax_device, cudaStream_t stream);
// The same with the output as an F32 view of one element.
Status tensor_amax_cuda(const TensorView& x, const TensorView& amax, cudaStream_t stream);

enum class PackedFormat { kNvfp4, kMxfp4 };

// A packed tensor as the quantizers above write it.
struct PackedTensor {
  PackedFormat format = PackedFormat::kNvfp4;
  TensorView packed;  // U8 [b, s, h, d / 2]
  TensorView scales;  // as above, in `layout`
  ScaleLayout layout = ScaleLayout::kRowMajor;
  // NVFP4 only: the encode scale, a host value, or (when s_enc_device is not null) one FP32 read
  // on the device, e.g. the s_enc_out of quantize_packed_nvfp4_cuda.
  float s_enc = 1.f;
  const float* s_enc_device = nullptr;
};

// Decode to out [b, s, h, d] F32 or BF16 (contiguous): NVFP4 e2m1 * scale / s_enc
// (nvfp4_dequantize), MXFP4 e2m1 * 2^(scale - 127) (mxfp4_dequantize), in FP32; BF16 output is
// the RNE of that FP32 value. NaN scales decode to NaN.
Status dequantize_packed_cuda(const PackedTensor& in, const TensorView& out, cudaStream_t stream);

// Packed storage -> kernel operands (operands.h layouts) of `recipe` and `role`:
// * Q/K, NVFP4 packed, recipe nvfp4 / nvfp4-hx / nvfp4-fast / nvfp4-all / fp4-direct: data
//   E4M3_RNE(e2m1 * scale / 8) of the given codes (no requantization), scale 8 / s_enc.
// * Q/K, MXFP4 packed, recipe mxfp4: data E4M3(e2m1 * 2^(e - t)), t = (largest block exponent of
//   the (b, h) slice, NaN blocks excluded) - 6, scale 2^t; NaN blocks give 0x7F.
// * Anything else (V, other recipes): dequantized to BF16 (scratch from the stream-ordered
//   allocator), then quantize_operand_cuda with opt. Not bit-exact to quantizing the original.
// opt.tensor_scale / opt.smooth_k only apply to that last path.
Status repack_to_operand_cuda(const PackedTensor& in, Recipe recipe, OperandRole role,
                              const OperandOptions& opt, const TensorView& data,
                              const TensorView& scale, const TensorView& mean, cudaStream_t stream);

// ==== End of packed storage ====================================================================

}  // namespace fp4attn
