// Launchers of the backward's kernels (one .cu each), called by bwd_launch.cu after validation,
// in this order on one stream (docs/kernels/bwd_sm90.md).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/backward/bwd_params.h"

namespace fp4attn::bwd {

// D = rowsum(dO * O) and the amax of dO and of dO * v_scale per (batch, head).
cudaError_t launch_prep_rows(const BwdParams& p, int d, cudaStream_t stream);
// dO in E5M2 (plain and transposed), Q transposed, with the scales from the amax.
cudaError_t launch_prep_quant(const BwdParams& p, int d, cudaStream_t stream);
// amax_pass: the amax of dS * k_scale and dS * q_scale per (batch, head) only; else the
// gradients (dK, dV written, dQ accumulated into dq_acc).
cudaError_t launch_main(const BwdParams& p, int d, bool amax_pass, cudaStream_t stream);
// The same on wgmma (main_v2.cu): 128-key CTAs, 64-query steps; p.key_blocks is v1's (64 keys),
// the v2 launcher recomputes it.
cudaError_t launch_main_v2(const BwdParams& p, int d, bool amax_pass, cudaStream_t stream);
// dq = dq_acc * softmax_scale * 2^-h_dq in the output dtype.
cudaError_t launch_dq_convert(const BwdParams& p, int d, cudaStream_t stream);

}  // namespace fp4attn::bwd
