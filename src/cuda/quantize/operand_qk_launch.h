// Host side shared by the Q/K operand launchers: operand_qk.cu (passes 2 and 3) and
// operand_qk_mean.cu (pass 1, the K mean).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/quantize/operand_qk_config.h"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/status.h"

namespace fp4attn::detail::qk_operand {

// A CUDA failure of the Q/K quantizer, naming what failed.
inline Status cuda_status(cudaError_t e, const char* what) {
  return sm90::cuda_status(e, "quantize_operand_cuda (Q/K)", what);
}

// Pass 1 (smooth_k): mean[b, h, d] (FP32, BF16-valued) of the slices of a, as
// golden::smooth_keys; all 0 when a.s == 0. a.nbh > 0. Queued on `stream`.
Status launch_k_mean(const XArgs& a, int d, bool f16, float* mean, cudaStream_t stream);

}  // namespace fp4attn::detail::qk_operand
