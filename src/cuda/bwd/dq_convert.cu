// The backward's last kernel: dq = dq_acc * softmax_scale (the main kernel sums dq_acc in real
// units), in the output's dtype and strides.
#include <algorithm>

#include "cuda/bwd/bits.h"
#include "cuda/bwd/device.cuh"
#include "cuda/bwd/kernels.h"

namespace fp4attn::bwd {
namespace {

constexpr int kThreads = 256;

// Eight channels per thread: two 16-byte loads of dq_acc.
__global__ void __launch_bounds__(kThreads) dq_convert_kernel(BwdParams p, int d) {
  const int lanes = d / 8;
  const int64_t total = int64_t(p.b) * p.h * p.s_q * lanes;
  for (int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x; x < total;
       x += int64_t(gridDim.x) * kThreads) {
    const int c0 = int(x % lanes) * 8;
    const int64_t row = x / lanes;  // (b * h + head) * s_q + i
    const int64_t i = row % p.s_q, bh = row / p.s_q;
    const int bb = int(bh / p.h), hh = int(bh % p.h);
    const float4* src = reinterpret_cast<const float4*>(p.dq_acc + row * d + c0);
    const float4 a = src[0], b = src[1];
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= p.softmax_scale;
    const int64_t off = bb * p.dq_stride[0] + i * p.dq_stride[1] + hh * p.dq_stride[2] + c0;
    if (p.dq_f32) {
      float* out = static_cast<float*>(p.dq) + off;
      if ((reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
        reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
        continue;
      }
    } else {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.dq) + off;
      if ((reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w[k] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k]))) |
                 uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1]))) << 16;
        }
        *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
        continue;
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) store_grad(p.dq, off + e, p.dq_f32, v[e]);
  }
}

}  // namespace

cudaError_t launch_dq_convert(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t total = int64_t(p.b) * p.h * p.s_q * (d / 8);
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16);
  dq_convert_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p, d);
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
