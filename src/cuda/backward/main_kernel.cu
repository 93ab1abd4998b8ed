// Instantiations and launch of the backward's main kernel (main_kernel.cuh): d 64 / 128 x the
// amax pass or the gradient pass; causal, GQA and determinism are runtime flags.
#include "cuda/backward/bwd_kernels.h"
#include "cuda/backward/main_kernel.cuh"

namespace fp4attn::bwd {
namespace {

template <int D, bool kAmax>
cudaError_t launch(const BwdParams& p, cudaStream_t stream) {
  const int smem = int(sizeof(MainSmem<D>));
  auto kernel = bwd_main_kernel<D, kAmax>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t ctas = int64_t(p.key_blocks) * p.b * p.h_kv;
  if (ctas == 0) return cudaSuccess;
  kernel<<<unsigned(ctas), kMainThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_main(const BwdParams& p, int d, bool amax_pass, cudaStream_t stream) {
  if (d == 128) return amax_pass ? launch<128, true>(p, stream) : launch<128, false>(p, stream);
  return amax_pass ? launch<64, true>(p, stream) : launch<64, false>(p, stream);
}

}  // namespace fp4attn::bwd
