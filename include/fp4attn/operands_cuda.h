// GPU kernel operands: the same bytes as quantize_operand_host (include/fp4attn/operands.h),
// written by CUDA kernels on `stream`. x lives in device memory (BF16 or FP16 BSHD), and so do
// data, scale and mean. Scratch memory comes from the stream-ordered allocator.
#pragma once

#include <cuda_runtime_api.h>

#include "fp4attn/operands.h"

namespace fp4attn {

Status quantize_operand_cuda(const TensorView& x, Recipe recipe, OperandRole role,
                             const OperandOptions& opt, const TensorView& data,
                             const TensorView& scale, const TensorView& mean, cudaStream_t stream);

namespace detail {
// Role-specific launchers behind quantize_operand_cuda, called after validation.
Status quantize_qk_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                                const TensorView& data, const TensorView& scale,
                                const TensorView& mean, cudaStream_t stream);
Status quantize_v_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                               const TensorView& data, const TensorView& scale,
                               cudaStream_t stream);
}  // namespace detail

}  // namespace fp4attn
