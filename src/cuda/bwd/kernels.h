// Launchers of the backward's kernels (one .cu each), called by launch.cu after validation,
// in this order on one stream (docs/kernels/bwd_sm90.md).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/bwd/params.h"

namespace fp4attn::bwd {

// D = rowsum(dO * O) and the amax of dO and of dO * v_scale per (batch, head).
cudaError_t launch_prep_rows(const BwdParams& p, int d, cudaStream_t stream);
// dO in E5M2 (plain and transposed), Q transposed, with the scales from the amax.
cudaError_t launch_prep_quant(const BwdParams& p, int d, cudaStream_t stream);
// The main kernel (main.cu): dhp_pass adds D_hp (DSource::kHighPrecisionO) only; else the
// gradients (dK, dV written, dQ accumulated into dq_acc).
cudaError_t launch_main(const BwdParams& p, int d, bool dhp_pass, cudaStream_t stream);
// dq = dq_acc * softmax_scale in the output dtype.
cudaError_t launch_dq_convert(const BwdParams& p, int d, cudaStream_t stream);

}  // namespace fp4attn::bwd
