// Host steps of a forward launch shared by attention_forward_operands_cuda (fwd_launch.cu) and
// the P-dump test entry point (fwd_dump_p.cu): the kernel parameters and the persistent grid.
#pragma once

#include <cuda_runtime_api.h>

#include "api/validate_forward.h"
#include "cuda/attention/fwd_params.h"
#include "fp4attn/attention.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::sm90 {

// Kernel parameters of a validated call (sh from validate_forward_operands, b, h and s_q > 0)
// whose K/V stages hold n keys (128 or 256): TMA maps, factors, output, LSE and row_max
// addressing (lse and row_max may be undefined).
Status make_forward_params(const ForwardOperands& in, const ForwardOptions& opt,
                           const ForwardShape& sh, const TensorView& o, const TensorView& lse,
                           const TensorView& row_max, int n, FwdParams* p);

// The persistent grid: min(tiles, SMs) CTAs (one per tile with FP4ATTN_FWD_PERSISTENT=0).
Status forward_grid(const FwdParams& p, dim3* grid);

// Sets the kernel's dynamic shared memory limit.
Status set_forward_smem(const void* kernel, int bytes);

}  // namespace fp4attn::sm90
