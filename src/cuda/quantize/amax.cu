// NaN-propagating tensor amax: tensor_amax_cuda, and packed::launch_amax_bits for the NVFP4
// quantizer's computed s_enc.
//
// One pass over x in 16-byte vectors (8 BF16/FP16 values), four vectors in flight per thread, a
// packed 16x2 max of the |.| bits (VIMNMX.U16x2), then the FP32 bits of the thread's maximum,
// a warp max (REDUX) and one atomicMax per warp. For non-negative floats the unsigned order of
// the bits is the order of the values, and every NaN's bits lie above +Inf's, so the maximum is
// NaN if any element is NaN, else +Inf if any is +-Inf.
#include <cuda_runtime.h>

#include <string>

#include "cuda/quantize/half16_vectors.cuh"
#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/packed_internal.h"
#include "cuda/quantize/row_map.h"
#include "fp4attn/quantize_cuda.h"
#include "validate/validate_cuda.h"

namespace fp4attn {
namespace packed {
namespace {

constexpr int kAmaxThreads = 256;
constexpr int kAmaxUnroll = 4;  // 16-byte vectors in flight per thread

struct AmaxParams {
  const uint8_t* x;
  int64_t vectors;  // numel / 8
  FastDiv div_vpr;  // vectors per row (d / 8)
  RowMap rows;
  bool contiguous;
  uint32_t* out_bits;
};

// Byte offset of vector v (8 elements) of x.
__device__ __forceinline__ int64_t vector_offset(const AmaxParams& p, int64_t v) {
  if (p.contiguous) return v * 16;
  const int64_t row = static_cast<int64_t>(p.div_vpr.div(static_cast<uint64_t>(v)));
  const int64_t col = v - row * static_cast<int64_t>(p.div_vpr.d);
  return (p.rows.offset(row) + col * 8) * 2;
}

// Registers (sm_90a, ptxas -v): see the table in packed_quantize_kernels.cuh.
template <typename T>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const AmaxParams p) {
  uint32_t acc = 0;  // two 16-bit lanes of |.| bits
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kAmaxThreads;
  int64_t v = static_cast<int64_t>(blockIdx.x) * kAmaxThreads + threadIdx.x;
  for (; v + (kAmaxUnroll - 1) * stride < p.vectors; v += kAmaxUnroll * stride) {
    uint4 w[kAmaxUnroll];
#pragma unroll
    for (int k = 0; k < kAmaxUnroll; ++k) w[k] = load16(p.x + vector_offset(p, v + k * stride));
#pragma unroll
    for (int k = 0; k < kAmaxUnroll; ++k) {
      acc = abs_max2(acc, w[k].x);
      acc = abs_max2(acc, w[k].y);
      acc = abs_max2(acc, w[k].z);
      acc = abs_max2(acc, w[k].w);
    }
  }
  for (; v < p.vectors; v += stride) {
    const uint4 w = load16(p.x + vector_offset(p, v));
    acc = abs_max2(acc, w.x);
    acc = abs_max2(acc, w.y);
    acc = abs_max2(acc, w.z);
    acc = abs_max2(acc, w.w);
  }
  const uint32_t bits =
      __reduce_max_sync(0xFFFFFFFFu, Half16<T>::abs16_to_f32_bits(fold_max2(acc)));
  if ((threadIdx.x & 31) == 0 && bits != 0) atomicMax(p.out_bits, bits);
}

}  // namespace

void launch_amax_bits(const TensorView& x, uint32_t* bits_device, cudaStream_t stream) {
  AmaxParams p;
  p.x = static_cast<const uint8_t*>(x.data);
  p.vectors = x.numel() / 8;
  p.div_vpr = FastDiv::make(static_cast<uint64_t>(x.shape[3] / 8));
  p.rows.div_h = FastDiv::make(static_cast<uint64_t>(x.shape[2]));
  p.rows.div_s = FastDiv::make(static_cast<uint64_t>(x.shape[1]));
  p.rows.stride_b = x.stride[0];
  p.rows.stride_s = x.stride[1];
  p.rows.stride_h = x.stride[2];
  p.contiguous = x.is_contiguous();
  p.out_bits = bits_device;
  const int grid = grid_for(p.vectors, kAmaxThreads * kAmaxUnroll);
  if (x.dtype == DType::kBF16) {
    amax_kernel<__nv_bfloat16><<<grid, kAmaxThreads, 0, stream>>>(p);
  } else {
    amax_kernel<__half><<<grid, kAmaxThreads, 0, stream>>>(p);
  }
}

}  // namespace packed

Status tensor_amax_cuda(const TensorView& x, float* amax_device, cudaStream_t stream) {
  FP4ATTN_RETURN_IF_ERROR(cuda_check::bshd_input(x, "x", {DType::kBF16, DType::kF16}, 16));
  if (x.shape[3] % 8 != 0) {
    return Status::Invalid("x: head_dim (" + std::to_string(x.shape[3]) +
                           ") must be a multiple of 8 (16-byte vectors)");
  }
  if (amax_device == nullptr) return Status::Invalid("amax: device pointer is null");
  FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(amax_device, "amax", 4));
  if (cudaMemsetAsync(amax_device, 0, sizeof(float), stream) != cudaSuccess) {
    return packed::launch_status("tensor_amax_cuda");
  }
  if (x.numel() == 0) return Status::Ok();
  packed::launch_amax_bits(x, reinterpret_cast<uint32_t*>(amax_device), stream);
  return packed::launch_status("tensor_amax_cuda");
}

Status tensor_amax_cuda(const TensorView& x, const TensorView& amax, cudaStream_t stream) {
  FP4ATTN_RETURN_IF_ERROR(cuda_check::output(amax, "amax", {1}, {DType::kF32}, 4));
  return tensor_amax_cuda(x, amax.as<float>(), stream);
}

}  // namespace fp4attn
