// The V channel scales written outside v_operand_kernel: the fp8-style finish between the two
// passes, and the constant scales of an input without tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_v_unit.cuh"

namespace fp4attn::detail::v_operand {

// fp8-style, between the two passes: per channel the scale (amax / 448, from the final amax)
// and, in place of the amax, fp8_inv_code(amax) for v_operand_kernel.
__global__ void v_fp8_finish_kernel(uint32_t* chan_amax, float* scale, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const uint32_t a = chan_amax[i];
  scale[i] = v_operand::channel_scale<VMode::kFp8>(a, v_operand::VUnitStats{});
  chan_amax[i] = __float_as_uint(v_operand::fp8_inv_code(a));
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = value;
}

}  // namespace fp4attn::detail::v_operand
