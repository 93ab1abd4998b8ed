// The tables the Q/K block kernels read instead of computing: the fold rows (the folded E4M3 byte
// of every E2M1 magnitude per NVFP4 scale code or MXFP4 exponent offset, fold_table_kernel) and
// the per-slice NVFP4 parameters (s_enc, factor and the scale table, nvfp4_slice_setup_kernel).
// The fold tables are __device__ variables of the including translation unit (no relocatable
// device code): include this only from the .cu that launches both the writer and the readers
// (operand_qk.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/packed_blocks.cuh"  // packed::nvfp4_fill_scale_table, nvfp4_table_finite
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn::detail::qk_operand {

// Row sc: the 8 folded bytes of NVFP4 scale code sc; row k + 248: MXFP4 offset k
// (operand_qk_fast.cuh). Rewritten with the same values by every launch of fold_table_kernel
// (idempotent).
__device__ uint2 g_nv_fold[256];
__device__ uint2 g_mx_fold[operand_fast::kMxFoldRows];

__global__ void fold_table_kernel() {
  const int i = threadIdx.x;
  if (i < 256) {
    const uint64_t r = operand_fast::nvfp4_fold_row(static_cast<uint32_t>(i));
    g_nv_fold[i] = make_uint2(static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32));
  } else if (i - 256 < operand_fast::kMxFoldRows) {
    const uint64_t r = operand_fast::mxfp4_fold_row(i - 256 + operand_fast::kMxFoldMinK);
    g_mx_fold[i - 256] = make_uint2(static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32));
  }
}

// The NVFP4 parameters of one (b, h) slice (or of all slices for a static s_enc), written by
// nvfp4_slice_setup_kernel so that the block kernels hold no division (their slow paths are calls,
// whose register convention cost the fast kernel registers and CTAs per SM).
struct Nvfp4Slice {
  float s_enc;
  float factor;   // golden_operands.cc: 8 / s_enc
  uint32_t fast;  // s_enc > 0 with packed::nvfp4_table_finite: nvfp4_operand_kernel, else generic
  uint32_t unused;
};

// One CTA of 128 threads per slice: its s_enc (static, or from the slice amax), factor and the
// table of packed::nvfp4_fill_scale_table.
template <Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(128)
    nvfp4_slice_setup_kernel(const uint32_t* __restrict__ slice_max, float static_s_enc,
                             Nvfp4Slice* __restrict__ slices, float2* __restrict__ tables) {
  const int64_t i = blockIdx.x;
  const float s_enc =
      static_s_enc != 0.f ? static_s_enc : nvfp4_tensor_scale(bits_float(slice_max[i]), kRule);
  packed::nvfp4_fill_scale_table(s_enc, tables + i * 128);
  if (threadIdx.x == 0) {
    const bool fast = s_enc > 0.f && packed::nvfp4_table_finite(s_enc);
    slices[i] = {s_enc, detail::div_rn(8.f, s_enc), fast ? 1u : 0u, 0u};
  }
}

}  // namespace fp4attn::detail::qk_operand
