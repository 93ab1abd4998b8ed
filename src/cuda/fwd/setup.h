// Host steps of a forward launch shared by launch.cuh and the tests' P-dump kernel
// (tests/support/fwd_dump_p.cu): the kernel parameters and the persistent grid.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/fwd/params.h"
#include "fp4attn/attention.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"
#include "validate/validate_forward.h"

namespace fp4attn::sm90 {

// Kernel parameters of a validated call (sh from validate_forward_operands, b, h and s_q > 0)
// whose K/V stages hold n keys (128 or 256): TMA maps, factors, output, LSE and row_max
// addressing (lse and row_max may be undefined).
Status make_forward_params(const ForwardOperands& in, const ForwardOptions& opt,
                           const ForwardShape& sh, const TensorView& o, const TensorView& lse,
                           const TensorView& row_max, int n, FwdParams* p);

// The persistent grid: min(tiles, SMs) CTAs.
Status forward_grid(const FwdParams& p, dim3* grid);

// Sets the kernel's dynamic shared memory limit.
Status set_forward_smem(const void* kernel, int bytes);

}  // namespace fp4attn::sm90
