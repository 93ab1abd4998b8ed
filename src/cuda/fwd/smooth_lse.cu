#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/fwd/smooth_lse.h"
#include "cuda/sm90/cuda_status.h"

namespace fp4attn::sm90 {
namespace {

struct SmoothLseArgs {
  const uint16_t* q;
  int64_t q_sb, q_ss, q_sh;  // element strides of q [b, s, h, d]
  const float* mean;         // [b, h_kv, d] contiguous
  float* lse;
  int64_t lse_sb, lse_sh;  // lse [b, h, s_q], token stride 1
  int b, h, h_kv, s_q, d;
  double scale;
};

template <bool kF16>
__device__ float value_of(uint16_t bits) {
  if constexpr (kF16) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(uint32_t(bits) << 16);
  }
}

// One thread per (b, h, row); the d channels in order (a float64 sum: any order is within one
// FP32 rounding of the exact dot product).
template <bool kF16>
__global__ void smooth_lse_kernel(SmoothLseArgs a) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = int64_t(a.b) * a.h * a.s_q;
  if (row >= rows) return;
  const int i = int(row % a.s_q);
  const int h = int(row / a.s_q % a.h);
  const int b = int(row / (int64_t(a.s_q) * a.h));
  const uint16_t* q = a.q + b * a.q_sb + i * a.q_ss + h * a.q_sh;
  const float* m = a.mean + (int64_t(b) * a.h_kv + h / (a.h / a.h_kv)) * a.d;
  double dot = 0;
  for (int c = 0; c < a.d; ++c) dot += double(value_of<kF16>(q[c])) * double(m[c]);
  float* l = a.lse + b * a.lse_sb + h * a.lse_sh + i;
  *l = float(double(*l) + a.scale * dot);
}

}  // namespace

Status add_smooth_k_lse(const TensorView& q, const TensorView& mean, double scale,
                        const TensorView& lse, cudaStream_t stream) {
  SmoothLseArgs a{static_cast<const uint16_t*>(q.data),
                  q.stride[0],
                  q.stride[1],
                  q.stride[2],
                  mean.as<float>(),
                  lse.as<float>(),
                  lse.stride[0],
                  lse.stride[1],
                  int(q.shape[0]),
                  int(q.shape[2]),
                  int(mean.shape[1]),
                  int(q.shape[1]),
                  int(q.shape[3]),
                  scale};
  const int64_t rows = int64_t(a.b) * a.h * a.s_q;
  if (rows == 0) return Status::Ok();
  constexpr int kThreadsPerBlock = 128;
  const unsigned blocks = unsigned((rows + kThreadsPerBlock - 1) / kThreadsPerBlock);
  if (q.dtype == DType::kF16) {
    smooth_lse_kernel<true><<<blocks, kThreadsPerBlock, 0, stream>>>(a);
  } else {
    smooth_lse_kernel<false><<<blocks, kThreadsPerBlock, 0, stream>>>(a);
  }
  return cuda_status(cudaGetLastError(), "smooth_lse_kernel launch");
}

}  // namespace fp4attn::sm90
