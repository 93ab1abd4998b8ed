// Pass 1 of the Q/K quantizer for smoothed K (launch_k_mean): the kernels of operand_qk_mean.cuh.
// The parallel sum (partials per token segment, then mean_finish_kernel) is the default; it is
// bit-identical to the token-order chain of mean_kernel (see kParallelMean).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_launch.h"
#include "cuda/quantize/operand_qk_mean.cuh"

namespace fp4attn::detail::qk_operand {

Status launch_k_mean(const XArgs& a, int d, bool f16, float* m, cudaStream_t stream) {
  const int64_t n = a.nbh * d;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  const bool vec =
      (d == 64 || d == 128) && a.nbh * ((a.s + kMeanSegVec - 1) / kMeanSegVec) <= kMaxGridX;
  const int64_t seg_len = vec ? kMeanSegVec : kMeanSeg;
  const int nseg = static_cast<int>(std::max<int64_t>((a.s + seg_len - 1) / seg_len, 1));
  if (kParallelMean && a.s > 0) {
    MeanPartial* part = nullptr;
    const size_t bytes = static_cast<size_t>(n) * nseg * sizeof(MeanPartial);
    FP4ATTN_RETURN_IF_ERROR(cuda_status(
        cudaMallocAsync(reinterpret_cast<void**>(&part), bytes, stream), "cudaMallocAsync"));
    const unsigned pblocks = static_cast<unsigned>((n * nseg + kThreads - 1) / kThreads);
    const unsigned vblocks = static_cast<unsigned>(a.nbh * nseg);  // one CTA per segment
    if (f16) {
      if (d == 128) {
        mean_partial_vec_kernel<true, 128><<<vblocks, kThreads, 0, stream>>>(a, nseg, part);
      } else if (d == 64) {
        mean_partial_vec_kernel<true, 64><<<vblocks, kThreads, 0, stream>>>(a, nseg, part);
      } else {
        mean_partial_kernel<true><<<pblocks, kThreads, 0, stream>>>(a, d, nseg, part);
      }
      mean_finish_kernel<true><<<blocks, kThreads, 0, stream>>>(a, d, nseg, part, m);
    } else {
      if (d == 128) {
        mean_partial_vec_kernel<false, 128><<<vblocks, kThreads, 0, stream>>>(a, nseg, part);
      } else if (d == 64) {
        mean_partial_vec_kernel<false, 64><<<vblocks, kThreads, 0, stream>>>(a, nseg, part);
      } else {
        mean_partial_kernel<false><<<pblocks, kThreads, 0, stream>>>(a, d, nseg, part);
      }
      mean_finish_kernel<false><<<blocks, kThreads, 0, stream>>>(a, d, nseg, part, m);
    }
    Status st = cuda_status(cudaGetLastError(), "mean kernels launch");
    const Status free_st = cuda_status(cudaFreeAsync(part, stream), "cudaFreeAsync");
    FP4ATTN_RETURN_IF_ERROR(st);
    FP4ATTN_RETURN_IF_ERROR(free_st);
  } else if (f16) {
    mean_kernel<true><<<blocks, kThreads, 0, stream>>>(a, d, m);
  } else {
    mean_kernel<false><<<blocks, kThreads, 0, stream>>>(a, d, m);
  }
  return cuda_status(cudaGetLastError(), "mean_kernel launch");
}

}  // namespace fp4attn::detail::qk_operand
