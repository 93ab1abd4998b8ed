// Backward preprocess, pass 1: the max |dO| and max |dO_c v_scale_c| of each (batch, head), folded
// into its amax record (order-independent integer max: deterministic). D needs the scales these
// fix, so prep_quant computes it. One block per (batch, head, 256 query rows), each thread 8
// channels of a row per 16-byte load: bandwidth-bound, 2 atomics per block.
#include "cuda/bwd/bits.h"
#include "cuda/bwd/device.cuh"
#include "cuda/bwd/kernels.h"

namespace fp4attn::bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 256;

template <int D>
__global__ void __launch_bounds__(kThreads) prep_rows_kernel(BwdParams p) {
  constexpr int kLanes = D / 8;  // threads per row
  constexpr int kRowsPerPass = kThreads / kLanes;
  __shared__ float part[kThreads / 32][2];
  const int chunks = (p.s_q + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t bh = blockIdx.x / chunks;
  const int chunk = int(blockIdx.x % chunks);
  const int bb = int(bh / p.h), hh = int(bh % p.h), hk = hh / (p.h / p.h_kv);
  const int c0 = (threadIdx.x % kLanes) * 8;
  const float* fvp = p.v_scale + (int64_t(bb) * p.h_kv + hk) * D + c0;
  float fv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) fv[e] = fvp[e];
  float m_do = 0.f, m_dofv = 0.f;
  const int end = min(p.s_q, (chunk + 1) * kRowsPerBlock);
  for (int i = chunk * kRowsPerBlock + int(threadIdx.x) / kLanes; i < end; i += kRowsPerPass) {
    float g[8];
    load8x16(p.dout + bb * p.do_stride[0] + int64_t(i) * p.do_stride[1] + hh * p.do_stride[2] + c0,
             p.do_f16, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      m_do = fmaxf(m_do, fabsf(g[e]));
      m_dofv = fmaxf(m_dofv, fabsf(g[e] * fv[e]));
    }
  }
  m_do = warp_max(m_do);
  m_dofv = warp_max(m_dofv);
  if (threadIdx.x % 32 == 0) {
    part[threadIdx.x / 32][0] = m_do;
    part[threadIdx.x / 32][1] = m_dofv;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) {
      m_do = fmaxf(m_do, part[w][0]);
      m_dofv = fmaxf(m_dofv, part[w][1]);
    }
    float* rec = p.amax + bh * kAmaxSlots;
    if (m_do > 0.f) atomic_max_nonneg(rec + kAmaxDo, m_do);
    if (m_dofv > 0.f) atomic_max_nonneg(rec + kAmaxDoFv, m_dofv);
  }
}

}  // namespace

cudaError_t launch_prep_rows(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t chunks = (int64_t(p.s_q) + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t blocks = int64_t(p.b) * p.h * chunks;
  if (blocks == 0) return cudaSuccess;
  if (d == 128) {
    prep_rows_kernel<128><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  } else {
    prep_rows_kernel<64><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
