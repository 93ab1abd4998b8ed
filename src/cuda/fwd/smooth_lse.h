// The LSE of attention over unsmoothed K from the forward's LSE over smoothed K (the int8
// recipes smooth K by its mean; numerics.md §3): softmax ignores the per-row constant
// scale * q_i . mean, the LSE does not.
#pragma once

#include <cuda_runtime_api.h>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::sm90 {

// lse[b, h, i] += scale * q[b, i, h, :] . mean[b, h / group, :], in float64 and rounded once to
// FP32, as fp4attn._ops.smooth_k_lse (q BSHD BF16/FP16, mean FP32 [b, h_kv, d], lse FP32
// [b, h, s_q] with strides, scale the softmax scale). Rows without keys (+inf) stay +inf.
// Queued on `stream`.
Status add_smooth_k_lse(const TensorView& q, const TensorView& mean, double scale,
                        const TensorView& lse, cudaStream_t stream);

}  // namespace fp4attn::sm90
