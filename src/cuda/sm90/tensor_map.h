// TMA tensor maps for the kernels' tiles (host code): cuTensorMapEncodeTiled through the
// runtime's driver entry point, so that nothing links -lcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp4attn::sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's function, or nullptr when the runtime cannot provide it.
inline EncodeTiledFn encode_tiled() {
  static EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A 3-D tensor (inner, mid, outer) of `elem`-byte elements (1: bytes, 4: FP32), dense, read in
// boxes of (box_inner, box_mid, 1) swizzled to the box's row width (64 or 128 bytes, as the
// wgmma descriptors of make_kmajor_desc expect); out-of-range elements read as zero and are not
// written. CUDA_ERROR_NOT_SUPPORTED when the driver lacks the entry point.
inline CUresult make_tiled_map_3d(CUtensorMap* map, const void* base, int64_t inner, int64_t mid,
                                  int64_t outer, int box_inner, int box_mid, int elem = 1) {
  EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(mid), cuuint64_t(outer)};
  const cuuint64_t strides[2] = {cuuint64_t(inner * elem), cuuint64_t(inner * mid * elem)};
  const cuuint32_t box[3] = {cuuint32_t(box_inner), cuuint32_t(box_mid), 1};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUtensorMapSwizzle swz =
      box_inner * elem == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const CUtensorMapDataType type =
      elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  return fn(map, type, 3, const_cast<void*>(base), dims, strides, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace fp4attn::sm90
