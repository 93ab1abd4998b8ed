// Instantiations and launch of the backward's v2 main kernel (main_v2_kernel.cuh): the TMA maps
// of the per-query-block tiles and of dq_acc, d 64 / 128 x the amax pass or the gradient pass.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/tensor_map_encode.h"
#include "cuda/backward/bwd_kernels.h"
#include "cuda/backward/main_v2_kernel.cuh"

namespace fp4attn::bwd {
namespace {

using sm90::encode_tiled;
using sm90::EncodeTiledFn;

// A 3-D tensor (inner, mid, outer) of `elem`-byte elements (1: bytes, 4: FP32), boxes of
// (box_inner, box_mid, 1) swizzled to the box's row width (64 or 128 bytes, as swizzle_offset and
// the wgmma descriptors); out-of-range elements read as zero and are not written.
cudaError_t make_map(CUtensorMap* map, const void* base, int64_t inner, int64_t mid, int64_t outer,
                     int box_inner, int box_mid, int elem = 1) {
  EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(mid), cuuint64_t(outer)};
  const cuuint64_t strides[2] = {cuuint64_t(inner * elem), cuuint64_t(inner * mid * elem)};
  const cuuint32_t box[3] = {cuuint32_t(box_inner), cuuint32_t(box_mid), 1};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUtensorMapSwizzle swz =
      box_inner * elem == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const CUtensorMapDataType type =
      elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult r = fn(map, type, 3, const_cast<void*>(base), dims, strides, box, estride,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int D, bool kAmax, bool kDqBulk, int kP>
cudaError_t launch(const BwdV2Params& P, cudaStream_t stream) {
  constexpr int smem = v2_smem_bytes<D, kAmax>();
  auto kernel = bwd_main_v2_kernel<D, kAmax, kDqBulk, kP>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t ctas = int64_t(P.p.key_blocks) * P.p.b * P.p.h_kv;
  if (ctas == 0) return cudaSuccess;
  kernel<<<unsigned(ctas), kV2Threads, smem, stream>>>(P);
  return cudaGetLastError();
}

// The amax or the gradient pass (dQ by bulk reductions or red) of one way to rebuild P.
template <int kP>
cudaError_t launch_pass(const BwdV2Params& P, int d, bool amax_pass, cudaStream_t stream) {
  if (amax_pass) {
    return d == 128 ? launch<128, true, false, kP>(P, stream)
                    : launch<64, true, false, kP>(P, stream);
  }
  if (P.p.dq_bulk) {
    return d == 128 ? launch<128, false, true, kP>(P, stream)
                    : launch<64, false, true, kP>(P, stream);
  }
  return d == 128 ? launch<128, false, false, kP>(P, stream)
                  : launch<64, false, false, kP>(P, stream);
}

}  // namespace

cudaError_t launch_main_v2(const BwdParams& p, int d, bool amax_pass, cudaStream_t stream) {
  BwdV2Params P{};
  P.p = p;
  P.p.key_blocks = (p.s_k + kV2Keys - 1) / kV2Keys;
  const int64_t bh = int64_t(p.b) * p.h;
  cudaError_t e = make_map(&P.tm_q, p.q, d, p.s_q, bh, d, kV2Queries);
  if (e == cudaSuccess) e = make_map(&P.tm_dov, p.do_v, d, p.s_q_pad, bh, d, kV2Queries);
  if (e == cudaSuccess) e = make_map(&P.tm_dot, p.do_t, p.s_q_pad, d, bh, kV2Queries, d);
  if (e == cudaSuccess) e = make_map(&P.tm_qt, p.q_t, p.s_q_pad, d, bh, kV2Queries, d);
  if (e == cudaSuccess && !amax_pass && p.dq_bulk) {
    e = make_map(&P.tm_dq, p.dq_acc, d, p.s_q, bh, kV2DqBoxCols, kV2Queries, 4);
  }
  if (e != cudaSuccess) return e;
  switch (p.p_mode) {
    case kBwdCodes:
      return launch_pass<kBwdCodes>(P, d, amax_pass, stream);
    case kBwdDirect:
      return launch_pass<kBwdDirect>(P, d, amax_pass, stream);
    default:
      return launch_pass<kBwdExp2>(P, d, amax_pass, stream);
  }
}

}  // namespace fp4attn::bwd
