// Repack of packed storage into kernel operands (repack_to_operand_cuda, quantize_cuda.h).
//
// Bit-exact folds (no requantization), one thread per scale block:
//   NVFP4 Q/K: E4M3_RNE(e2m1 * scale / 8) (both products exact in FP32), factor 8 / s_enc;
//   MXFP4 Q/K: E4M3(e2m1 * 2^(e - t)), t = max block exponent of the (b, h) slice - 6 (NaN blocks
//              excluded; first pass: an atomicMax per block into a stream-ordered scratch),
//              factor 2^t.
// NaN blocks give 0x7F, as float_to_e4m3 of the golden model's NaN values.
// Every other combination dequantizes to BF16 and calls quantize_operand_cuda.
#include <cuda_runtime.h>

#include <string>

#include "cuda/quantize/packed_common.cuh"
#include "cuda/quantize/packed_internal.h"
#include "cuda/quantize/validate_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"

namespace fp4attn {
namespace {

using packed::FastDiv;

constexpr int kThreads = 256;
constexpr int kPow2FoldTop = 6;  // golden_operands.cc: the largest block lands at 2^6

struct RepackParams {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t blocks;
  int64_t sf_cols, block, d, s, h;
  FastDiv div_sf_cols, div_h, div_s;
  bool swizzled;
  uint8_t* data;            // E4M3 [b, h, s, d]
  unsigned* slice_max;      // MXFP4: per (b, h): 1 + largest non-NaN scale code, 0 if none
  float* scale;             // FP32 [b, h, tiles]
  int64_t tiles;
  float s_enc;
  const float* s_enc_ptr;
};

struct BlockPos {
  int64_t row, col, bh, si;
};

__device__ __forceinline__ BlockPos position(const RepackParams& p, int64_t g) {
  BlockPos q;
  q.row = static_cast<int64_t>(p.div_sf_cols.div(static_cast<uint64_t>(g)));
  q.col = g - q.row * p.sf_cols;
  const int64_t bs = static_cast<int64_t>(p.div_h.div(static_cast<uint64_t>(q.row)));
  const int64_t hi = q.row - bs * p.h;
  const int64_t bi = static_cast<int64_t>(p.div_s.div(static_cast<uint64_t>(bs)));
  q.si = bs - bi * p.s;
  q.bh = bi * p.h + hi;
  return q;
}

__device__ __forceinline__ uint8_t load_scale(const RepackParams& p, const BlockPos& q,
                                              int64_t g) {
  return p.scales[p.swizzled ? swizzled_scale_offset(q.row, q.col, p.sf_cols) : g];
}

__device__ __forceinline__ uint8_t* dst_of(const RepackParams& p, const BlockPos& q) {
  return p.data + (q.bh * p.s + q.si) * p.d + q.col * p.block;
}

__global__ void __launch_bounds__(kThreads) nvfp4_fold_kernel(const RepackParams p) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < p.blocks;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const BlockPos q = position(p, g);
    const uint8_t sc = load_scale(p, q, g);
    const uint2 w = *reinterpret_cast<const uint2*>(p.packed + 8 * g);
    const float f = e4m3_to_float(sc);
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? w.x : w.y;
      uint32_t o = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t c = static_cast<uint8_t>((word >> (16 * (k & 1) + 4 * i)) & 0xFu);
        const float prod = detail::mul_rn(e2m1_to_float(c), f);  // exact
        const uint8_t e = (sc & 0x7Fu) == 0x7Fu ? 0x7F : float_to_e4m3(detail::mul_rn(prod, 0.125f));
        o |= static_cast<uint32_t>(e) << (8 * i);
      }
      out[k] = o;
    }
    *reinterpret_cast<uint4*>(dst_of(p, q)) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

__global__ void __launch_bounds__(kThreads) mxfp4_slice_max_kernel(const RepackParams p) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < p.blocks;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const BlockPos q = position(p, g);
    const uint8_t sc = load_scale(p, q, g);
    if (sc != 0xFF) atomicMax(p.slice_max + q.bh, static_cast<unsigned>(sc) + 1u);
  }
}

__device__ __forceinline__ int fold_offset(unsigned slice_max) {
  return slice_max == 0 ? 0 : static_cast<int>(slice_max) - 1 - 127 - kPow2FoldTop;
}

__global__ void __launch_bounds__(kThreads) mxfp4_fold_kernel(const RepackParams p) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < p.blocks;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const BlockPos q = position(p, g);
    const uint8_t sc = load_scale(p, q, g);
    const uint4 w = *reinterpret_cast<const uint4*>(p.packed + 16 * g);
    const int t = fold_offset(p.slice_max[q.bh]);
    const int k = static_cast<int>(sc) - 127 - t;  // in [-248, 6]
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = words[j / 2];
      uint32_t o = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t c = static_cast<uint8_t>((word >> (16 * (j & 1) + 4 * i)) & 0xFu);
        const uint8_t e =
            sc == 0xFF ? 0x7F : float_to_e4m3(detail::scale_pow2(e2m1_to_float(c), k));
        o |= static_cast<uint32_t>(e) << (8 * i);
      }
      out[j] = o;
    }
    uint4* dst = reinterpret_cast<uint4*>(dst_of(p, q));
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

// scale[bh, tile]: 8 / s_enc (NVFP4) or 2^t (MXFP4).
__global__ void factor_kernel(const RepackParams p, int64_t n, bool nv) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (nv) {
      const float s_enc = p.s_enc_ptr != nullptr ? *p.s_enc_ptr : p.s_enc;
      p.scale[i] = detail::div_rn(8.f, s_enc);
    } else {
      p.scale[i] = detail::scale_pow2(1.f, fold_offset(p.slice_max[i / p.tiles]));
    }
  }
}

bool is_nvfp4_qk_recipe(Recipe r) {
  return r == Recipe::kNvfp4 || r == Recipe::kNvfp4Hx || r == Recipe::kNvfp4Fast ||
         r == Recipe::kNvfp4All || r == Recipe::kFp4Direct;
}

Status repack_via_bf16(const PackedTensor& in, Recipe recipe, OperandRole role,
                       const OperandOptions& opt, const TensorView& data, const TensorView& scale,
                       const TensorView& mean, int64_t b, int64_t s, int64_t h, int64_t d,
                       cudaStream_t stream) {
  const int64_t n = b * s * h * d;
  void* tmp = nullptr;
  if (n > 0 && cudaMallocAsync(&tmp, static_cast<size_t>(n) * 2, stream) != cudaSuccess) {
    return packed::launch_status("repack_to_operand_cuda (scratch)");
  }
  const TensorView x = make_view(tmp, DType::kBF16, {b, s, h, d});
  Status st = dequantize_packed_cuda(in, x, stream);
  if (st.ok()) st = quantize_operand_cuda(x, recipe, role, opt, data, scale, mean, stream);
  if (tmp != nullptr) cudaFreeAsync(tmp, stream);
  return st;
}

}  // namespace

Status repack_to_operand_cuda(const PackedTensor& in, Recipe recipe, OperandRole role,
                              const OperandOptions& opt, const TensorView& data,
                              const TensorView& scale, const TensorView& mean,
                              cudaStream_t stream) {
  int64_t b, s, h, d;
  FP4ATTN_RETURN_IF_ERROR(packed::check_packed(in, &b, &s, &h, &d));
  const bool qk = role == OperandRole::kQ || role == OperandRole::kK;
  const bool nv = in.format == PackedFormat::kNvfp4;
  const bool fold = qk && !opt.smooth_k &&
                    ((nv && is_nvfp4_qk_recipe(recipe)) || (!nv && recipe == Recipe::kMxfp4));
  if (!fold) return repack_via_bf16(in, recipe, role, opt, data, scale, mean, b, s, h, d, stream);
  if (mean.defined()) {
    return Status::Invalid("mean: must be undefined (opt.smooth_k is false)");
  }
  const int64_t tiles = operand_scale_tiles(s);
  FP4ATTN_RETURN_IF_ERROR(cuda_check::output(data, "data", {b, h, s, d}, {DType::kE4M3}, 16));
  FP4ATTN_RETURN_IF_ERROR(cuda_check::output(scale, "scale", {b, h, tiles}, {DType::kF32}, 4));
  const int64_t rows = b * s * h;
  const int64_t block = nv ? kNvfp4Block : kMxfp4Block;
  RepackParams p;
  p.packed = static_cast<const uint8_t*>(in.packed.data);
  p.scales = static_cast<const uint8_t*>(in.scales.data);
  p.blocks = rows * (d / block);
  p.sf_cols = d / block;
  p.block = block;
  p.d = d;
  p.s = s;
  p.h = h;
  p.div_sf_cols = FastDiv::make(static_cast<uint64_t>(p.sf_cols > 0 ? p.sf_cols : 1));
  p.div_h = FastDiv::make(static_cast<uint64_t>(h > 0 ? h : 1));
  p.div_s = FastDiv::make(static_cast<uint64_t>(s > 0 ? s : 1));
  p.swizzled = in.layout == ScaleLayout::kSwizzled128x4;
  p.data = static_cast<uint8_t*>(data.data);
  p.slice_max = nullptr;
  p.scale = scale.as<float>();
  p.tiles = tiles;
  p.s_enc = in.s_enc;
  p.s_enc_ptr = in.s_enc_device;
  const int64_t n_scale = b * h * tiles;
  if (n_scale == 0) return Status::Ok();  // no (b, h) slice or no token: nothing to write
  if (!nv) {
    void* tmp = nullptr;
    if (cudaMallocAsync(&tmp, static_cast<size_t>(b * h) * sizeof(unsigned), stream) !=
            cudaSuccess ||
        cudaMemsetAsync(tmp, 0, static_cast<size_t>(b * h) * sizeof(unsigned), stream) !=
            cudaSuccess) {
      return packed::launch_status("repack_to_operand_cuda (scratch)");
    }
    p.slice_max = static_cast<unsigned*>(tmp);
  }
  const int grid = packed::grid_for(p.blocks, kThreads);
  if (nv) {
    if (p.blocks > 0) nvfp4_fold_kernel<<<grid, kThreads, 0, stream>>>(p);
  } else if (p.blocks > 0) {
    mxfp4_slice_max_kernel<<<grid, kThreads, 0, stream>>>(p);
    mxfp4_fold_kernel<<<grid, kThreads, 0, stream>>>(p);
  }
  factor_kernel<<<packed::grid_for(n_scale, 256, 2), 256, 0, stream>>>(p, n_scale, nv);
  if (p.slice_max != nullptr) cudaFreeAsync(p.slice_max, stream);
  return packed::launch_status("repack_to_operand_cuda");
}

}  // namespace fp4attn
