// Packed FP4 storage on the host: the quantizers of quantize_cuda.h (contract B, row-major
// scales) and the bit-exact Q/K fold of repack_to_operand_cuda, for CPU tensors, through the
// golden model's codecs. The context-parallel ring (fp4attn.distributed) sends K/V packed on gloo
// as it does on NCCL, so the CPU tests cover the wire format the GPUs use.
//
// It lives with the Python extension because only the extension needs it today.
#pragma once

#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::py {

// x: BSHD [b, s, h, d] F32/BF16/F16 (any non-negative strides, last dim contiguous), rows = b * s
// * h in that order, blocks along d (16 NVFP4, 32 MXFP4; d a multiple of the block).
// packed: U8 [b, s, h, d / 2] contiguous (element 2j in the low nibble of byte j).
// scales: U8 [b, s, h, d / block] contiguous (E4M3 codes for NVFP4, UE8M0 for MXFP4).
// NVFP4: s_enc > 0 is used as given; s_enc == 0 computes nvfp4_tensor_scale(amax of x, rule) with
// a NaN-propagating amax over the whole x. s_enc_out: F32 [1] receiving the s_enc used, or
// undefined. The bytes equal quantize_packed_nvfp4_cuda's.
Status quantize_packed_nvfp4_host(const TensorView& x, Nvfp4ScaleRule rule, float s_enc,
                                  const TensorView& packed, const TensorView& scales,
                                  const TensorView& s_enc_out);
Status quantize_packed_mxfp4_host(const TensorView& x, MxScaleRule rule, const TensorView& packed,
                                  const TensorView& scales);

// Whether repack_to_operand_cuda folds packed (NVFP4 when `nvfp4`, else MXFP4) codes for `recipe`
// and `role` without requantizing (bit-exact): Q/K, NVFP4 with an nvfp4* / fp4-direct recipe,
// MXFP4 with mxfp4. Unsupported naming the arguments otherwise.
Status check_exact_repack(bool nvfp4, Recipe recipe, OperandRole role);

// The fold of repack_to_operand_cuda on the host (only the combinations check_exact_repack
// accepts): packed / scales as above ([b, s, h, ...], row-major scales), data E4M3 [b, h, s, d]
// and scale F32 [b, h, ceil(s / 128)] contiguous. NVFP4: data E4M3(e2m1 * scale / 8), scale
// 8 / s_enc. MXFP4: data E4M3(e2m1 * 2^(e - t)), t = largest non-NaN block exponent of each
// (b, h) slice - 6, scale 2^t. NaN blocks give 0x7F.
Status repack_to_operand_host(const TensorView& packed, const TensorView& scales, bool nvfp4,
                              float s_enc, Recipe recipe, OperandRole role, const TensorView& data,
                              const TensorView& scale);

}  // namespace fp4attn::py
