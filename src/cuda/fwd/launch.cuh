// The forward kernel's launch for one P mode (the instantiations): the head dim and key-block
// width of a validated call pick the kernel. Included by launch.cu for the recipes' P modes and
// by the benchmark's bound target for kPConstant.
#pragma once

#include <cuda_runtime.h>

#include "cuda/fwd/config.h"
#include "cuda/fwd/kernel.cuh"
#include "cuda/fwd/p_mode.h"
#include "cuda/fwd/setup.h"
#include "cuda/sm90/cuda_status.h"

namespace fp4attn::sm90 {

template <int D, int PM, int N, bool kS8>
Status launch_kernel(const FwdParams& p, cudaStream_t stream) {
  auto kernel = fwd_kernel<D, PM, N, kS8>;
  constexpr int smem = fwd_smem_bytes<D, PM, N>();
  FP4ATTN_RETURN_IF_ERROR(set_forward_smem(reinterpret_cast<const void*>(kernel), smem));
  dim3 grid;
  FP4ATTN_RETURN_IF_ERROR(forward_grid(p, &grid));
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cuda_status(cudaGetLastError(), "fwd kernel launch");
}

// Operands, options and shape as validate_forward_operands left them (b, h, s_q > 0). fp4-direct
// and nvfp4-all run 128-key blocks only (one kernel fewer per head dim each). kS8: INT8 Q and K
// (the int8 recipes; exp2 and code-map P only).
template <int PM, bool kS8 = false>
Status launch_forward(const ForwardOperands& in, const ForwardOptions& opt, const ForwardShape& sh,
                      const TensorView& o, const TensorView& lse, const TensorView& row_max,
                      cudaStream_t stream) {
  constexpr bool kHasWide = PM != kPDirect && PM != kPAll;
  const int d = int(sh.d);
  const bool wide = kHasWide && fwd_wide_block(d, opt.causal, sh.s_k);
  FwdParams p;
  FP4ATTN_RETURN_IF_ERROR(
      make_forward_params(in, opt, sh, o, lse, row_max, wide ? kWideN : kNarrowN, &p));
  if (d == 128) return launch_kernel<128, PM, kNarrowN, kS8>(p, stream);
  if constexpr (kHasWide) {
    if (wide) return launch_kernel<64, PM, kWideN, kS8>(p, stream);
  }
  return launch_kernel<64, PM, kNarrowN, kS8>(p, stream);
}

}  // namespace fp4attn::sm90
