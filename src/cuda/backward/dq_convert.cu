// The backward's last kernel: dq = dq_acc * softmax_scale * 2^-h (h: the (batch, head) scale of
// the dS operand of dQ = dS K), in the output's dtype and strides.
#include <algorithm>

#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_device.cuh"
#include "cuda/backward/bwd_kernels.h"

namespace fp4attn::bwd {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) dq_convert_kernel(BwdParams p, int d) {
  const int64_t total = int64_t(p.b) * p.h * p.s_q * d;
  for (int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x; x < total;
       x += int64_t(gridDim.x) * kThreads) {
    const int c = int(x % d);
    const int64_t row = x / d;  // (b * h + head) * s_q + i
    const int64_t i = row % p.s_q, bh = row / p.s_q;
    const int bb = int(bh / p.h), hh = int(bh % p.h);
    const int h_dq = pow2_scale_exp(p.amax[bh * kAmaxSlots + kAmaxDsK], kE4m3Top);
    const float v = mul_pow2(p.dq_acc[x], -h_dq) * p.softmax_scale;
    store_grad(p.dq, bb * p.dq_stride[0] + i * p.dq_stride[1] + hh * p.dq_stride[2] + c, p.dq_f32,
               v);
  }
}

}  // namespace

cudaError_t launch_dq_convert(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t total = int64_t(p.b) * p.h * p.s_q * d;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 4096);
  dq_convert_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p, d);
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
