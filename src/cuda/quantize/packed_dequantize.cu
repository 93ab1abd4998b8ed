// Dequantizer of packed NVFP4 / MXFP4 storage (dequantize_packed_cuda): per value the host
// codecs' nvfp4_dequantize / mxfp4_dequantize in FP32; BF16 output is the RNE of that value.
// One thread per 16 packed bytes (32 values): one 16-byte load (8 for the last unit of an odd
// NVFP4 block count), one or two scale bytes, 128 (F32) or 64 (BF16) bytes of 16-byte stores.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/bf16_rne.h"
#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/packed_internal.h"
#include "cuda/quantize/row_map.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"
#include "validate/validate_cuda.h"

namespace fp4attn {
namespace {

using packed::FastDiv;

constexpr int kThreads = 256;

struct DequantParams {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t units;   // ceil(rows * d / 32)
  int64_t blocks;  // rows * d / block
  int64_t sf_cols;
  FastDiv div_sf_cols;
  bool swizzled;
  float s_enc;
  const float* s_enc_ptr;
  void* out;
};

__device__ __forceinline__ uint8_t load_scale(const DequantParams& p, int64_t g) {
  if (!p.swizzled) return p.scales[g];
  const int64_t row = static_cast<int64_t>(p.div_sf_cols.div(static_cast<uint64_t>(g)));
  return p.scales[swizzled_scale_offset(row, g - row * p.sf_cols, p.sf_cols)];
}

// 8 values of packed word w decoded with one scale.
template <bool kNv>
__device__ __forceinline__ void decode8(uint32_t w, uint8_t scale, float s_enc, float* v) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint8_t c = static_cast<uint8_t>((w >> (4 * i)) & 0xFu);
    v[i] = kNv ? nvfp4_dequantize(c, scale, s_enc) : mxfp4_dequantize(c, scale);
  }
}

template <bool kNv, bool kBf16>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const DequantParams p) {
  const float s_enc = p.s_enc_ptr != nullptr ? *p.s_enc_ptr : p.s_enc;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < p.units;
       u += stride) {
    const bool two = !kNv || 2 * u + 1 < p.blocks;
    uint4 w;
    if (two) {
      w = __ldcs(reinterpret_cast<const uint4*>(p.packed + 16 * u));
    } else {
      const uint2 h = __ldcs(reinterpret_cast<const uint2*>(p.packed + 16 * u));
      w = make_uint4(h.x, h.y, 0, 0);
    }
    uint8_t s0, s1;
    if (kNv) {
      s0 = load_scale(p, 2 * u);
      s1 = two ? load_scale(p, 2 * u + 1) : 0;
    } else {
      s0 = s1 = load_scale(p, u);
    }
    float v[32];
    decode8<kNv>(w.x, s0, s_enc, v);
    decode8<kNv>(w.y, s0, s_enc, v + 8);
    decode8<kNv>(w.z, s1, s_enc, v + 16);
    decode8<kNv>(w.w, s1, s_enc, v + 24);
    const int n4 = two ? 8 : 4;  // 4-value groups to store
    if (kBf16) {
      uint4* dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + 32 * u);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (2 * k < n4) {
          uint32_t q[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            q[j] = detail::bf16_rne_bits(v[8 * k + 2 * j]) |
                   (detail::bf16_rne_bits(v[8 * k + 2 * j + 1]) << 16);
          }
          __stcs(dst + k, make_uint4(q[0], q[1], q[2], q[3]));
        }
      }
    } else {
      float4* dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + 32 * u);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k < n4)
          __stcs(dst + k, make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]));
      }
    }
  }
}

}  // namespace

Status dequantize_packed_cuda(const PackedTensor& in, const TensorView& out, cudaStream_t stream) {
  int64_t b, s, h, d;
  FP4ATTN_RETURN_IF_ERROR(packed::check_packed(in, &b, &s, &h, &d));
  FP4ATTN_RETURN_IF_ERROR(
      cuda_check::output(out, "out", {b, s, h, d}, {DType::kF32, DType::kBF16}, 16));
  const bool nv = in.format == PackedFormat::kNvfp4;
  const int64_t block = nv ? kNvfp4Block : kMxfp4Block;
  const int64_t rows = b * s * h;
  if (rows * d == 0) return Status::Ok();
  DequantParams p;
  p.packed = static_cast<const uint8_t*>(in.packed.data);
  p.scales = static_cast<const uint8_t*>(in.scales.data);
  p.units = (rows * d + 31) / 32;
  p.blocks = rows * d / block;
  p.sf_cols = d / block;
  p.div_sf_cols = FastDiv::make(static_cast<uint64_t>(p.sf_cols));
  p.swizzled = in.layout == ScaleLayout::kSwizzled128x4;
  p.s_enc = in.s_enc;
  p.s_enc_ptr = in.s_enc_device;
  p.out = out.data;
  const int grid = packed::grid_for(p.units, kThreads);
  const bool bf16 = out.dtype == DType::kBF16;
  if (nv && bf16) {
    dequant_kernel<true, true><<<grid, kThreads, 0, stream>>>(p);
  } else if (nv) {
    dequant_kernel<true, false><<<grid, kThreads, 0, stream>>>(p);
  } else if (bf16) {
    dequant_kernel<false, true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    dequant_kernel<false, false><<<grid, kThreads, 0, stream>>>(p);
  }
  return packed::launch_status("dequantize_packed_cuda");
}

}  // namespace fp4attn
