// Instantiations and launch of the backward's main kernel (main_kernel.cuh): the TMA maps of the
// per-query-block tiles and of dq_acc, d 64 / 128 x the D_hp pass or the gradient pass x the P
// modes.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/bwd/kernels.h"
#include "cuda/bwd/main_kernel.cuh"
#include "cuda/sm90/tensor_map.h"

namespace fp4attn::bwd {
namespace {

// A dense 3-D tensor's tiled map (sm90::make_tiled_map_3d) as a runtime error code.
cudaError_t make_map(CUtensorMap* map, const void* base, int64_t inner, int64_t mid, int64_t outer,
                     int box_inner, int box_mid, int elem = 1) {
  const CUresult r =
      sm90::make_tiled_map_3d(map, base, inner, mid, outer, box_inner, box_mid, elem);
  if (r == CUDA_ERROR_NOT_SUPPORTED) return cudaErrorNotSupported;
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int D, bool kDhp, int kP>
cudaError_t launch(const MainParams& P, cudaStream_t stream) {
  constexpr int smem = main_smem_bytes<D, kDhp>();
  auto kernel = bwd_main_kernel<D, kDhp, kP>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t ctas = int64_t(P.p.key_blocks) * P.p.b * P.p.h_kv;
  if (ctas == 0) return cudaSuccess;
  kernel<<<unsigned(ctas), kMainThreads, smem, stream>>>(P);
  return cudaGetLastError();
}

// The D_hp or the gradient pass of one way to rebuild P.
template <int kP>
cudaError_t launch_pass(const MainParams& P, int d, bool dhp_pass, cudaStream_t stream) {
  if (d == 128) {
    return dhp_pass ? launch<128, true, kP>(P, stream) : launch<128, false, kP>(P, stream);
  }
  return dhp_pass ? launch<64, true, kP>(P, stream) : launch<64, false, kP>(P, stream);
}

}  // namespace

cudaError_t launch_main(const BwdParams& p, int d, bool dhp_pass, cudaStream_t stream) {
  MainParams P{};
  P.p = p;
  P.p.key_blocks = (p.s_k + kKeyBlock - 1) / kKeyBlock;
  const int64_t bh = int64_t(p.b) * p.h;
  cudaError_t e = make_map(&P.tm_q, p.q, d, p.s_q, bh, d, kQueryBlock);
  if (e == cudaSuccess) e = make_map(&P.tm_dov, p.do_v, d, p.s_q_pad, bh, d, kQueryBlock);
  if (e == cudaSuccess) e = make_map(&P.tm_dot, p.do_t, p.s_q_pad, d, bh, kQueryBlock, d);
  if (e == cudaSuccess) e = make_map(&P.tm_qt, p.q_t, p.s_q_pad, d, bh, kQueryBlock, d);
  if (e == cudaSuccess && !dhp_pass) {
    e = make_map(&P.tm_dq, p.dq_acc, d, p.s_q, bh, kDqBoxCols, kQueryBlock, 4);
  }
  if (e != cudaSuccess) return e;
  switch (p.p_mode) {
    case sm90::kPCodes:
      return launch_pass<sm90::kPCodes>(P, d, dhp_pass, stream);
    case sm90::kPDirect:
      return launch_pass<sm90::kPDirect>(P, d, dhp_pass, stream);
    default:
      return launch_pass<sm90::kPExp2>(P, d, dhp_pass, stream);
  }
}

}  // namespace fp4attn::bwd
