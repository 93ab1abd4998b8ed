// Backward preprocess, pass 1: one warp per row (batch, query, head) of dO: the row's max |dO|
// and max |dO_c v_scale_c| folded into the (batch, head) amax record (order-independent integer
// max: deterministic). D needs the scales these fix, so prep_quant computes it.
#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_device.cuh"
#include "cuda/backward/bwd_kernels.h"

namespace fp4attn::bwd {
namespace {

constexpr int kWarps = 8;

template <int D>
__global__ void __launch_bounds__(kWarps * 32) prep_rows_kernel(BwdParams p) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.b) * p.s_q * p.h;
  if (row >= rows) return;
  const int hh = int(row % p.h);
  const int64_t i = (row / p.h) % p.s_q;
  const int bb = int(row / (int64_t(p.h) * p.s_q));
  const int hk = hh / (p.h / p.h_kv);
  const uint16_t* dor = p.dout + bb * p.do_stride[0] + i * p.do_stride[1] + hh * p.do_stride[2];
  const float* fv = p.v_scale + (int64_t(bb) * p.h_kv + hk) * D;
  float m_do = 0.f, m_dofv = 0.f;
#pragma unroll
  for (int u = 0; u < D / 32; ++u) {
    const int c = lane + 32 * u;
    const float g = load16(dor + c, p.do_f16);
    m_do = fmaxf(m_do, fabsf(g));
    m_dofv = fmaxf(m_dofv, fabsf(g * fv[c]));
  }
  m_do = warp_max(m_do);
  m_dofv = warp_max(m_dofv);
  if (lane == 0) {
    float* rec = p.amax + (int64_t(bb) * p.h + hh) * kAmaxSlots;
    if (m_do > 0.f) atomic_max_nonneg(rec + kAmaxDo, m_do);
    if (m_dofv > 0.f) atomic_max_nonneg(rec + kAmaxDoFv, m_dofv);
  }
}

}  // namespace

cudaError_t launch_prep_rows(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t rows = int64_t(p.b) * p.s_q * p.h;
  if (rows == 0) return cudaSuccess;
  const dim3 grid(unsigned((rows + kWarps - 1) / kWarps));
  if (d == 128) {
    prep_rows_kernel<128><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    prep_rows_kernel<64><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
