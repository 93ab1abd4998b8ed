// Backward preprocess, pass 2: per (batch, head, block of 32 queries), the FP8 operands that the
// main kernel reads with 32-bit shared-memory loads (numerics.md §8):
//  * do_v = E5M2(2^g' dO_ic v_scale_c), row-major [query][channel] (B operand of dP^T = V dO^T);
//  * do_t = E5M2(2^g dO_ic), transposed [channel][query] (B operand of dV = P^T dO);
//  * q_t  = Q's E4M3 bytes, transposed (B operand of dK = dS^T Q);
//  * D = sum_c dO'_ic O_ic with dO' the dO that dP sees (do_v's E5M2 value, 2^g' and v_scale
//    undone), so that the rows of dS sum to ~0 as in exact arithmetic (numerics.md §8);
// the transposed ones with each 16-query group in the permuted order of bwd_bits.h. The
// roundings are the golden model's codecs (formats.h), so the bytes equal its operands.
#include "cuda/backward/bwd_bits.h"
#include "cuda/backward/bwd_device.cuh"
#include "cuda/backward/bwd_kernels.h"
#include "fp4attn/formats.h"

namespace fp4attn::bwd {
namespace {

constexpr int kThreads = 128;

template <int D>
__global__ void __launch_bounds__(kThreads) prep_quant_kernel(BwdParams p) {
  __shared__ __align__(16) uint8_t t_do[D][kBlockQueries];
  __shared__ __align__(16) uint8_t t_q[D][kBlockQueries];
  __shared__ float d_part[kBlockQueries][D / 32];  // per-warp partial sums of D, summed in order
  const int blocks = p.s_q_pad / kBlockQueries;
  const int blk = int(blockIdx.x % blocks);
  const int64_t bh = blockIdx.x / blocks;  // b * h + head
  const int bb = int(bh / p.h), hh = int(bh % p.h);
  const int hk = hh / (p.h / p.h_kv);
  const float* rec = p.amax + bh * kAmaxSlots;
  const int g_do = pow2_scale_exp(rec[kAmaxDo], kE5m2Top);
  const int g_dp = pow2_scale_exp(rec[kAmaxDoFv], kE5m2Top);
  const float* fv = p.v_scale + (int64_t(bb) * p.h_kv + hk) * D;
  // A warp covers 32 consecutive channels of one row (D and kThreads are multiples of 32).
  for (int idx = threadIdx.x; idx < kBlockQueries * D; idx += kThreads) {
    const int il = idx / D, c = idx % D;
    const int64_t i = int64_t(blk) * kBlockQueries + il;
    uint8_t v1 = 0, v2 = 0, qb = 0;
    float d_term = 0.f;
    if (i < p.s_q) {
      const float g = load16(
          p.dout + bb * p.do_stride[0] + i * p.do_stride[1] + hh * p.do_stride[2] + c, p.do_f16);
      v1 = float_to_e5m2(mul_pow2(g * fv[c], g_dp));
      v2 = float_to_e5m2(mul_pow2(g, g_do));
      qb = p.q[(bh * p.s_q + i) * D + c];
      const float o =
          load16(p.o + bb * p.o_stride[0] + i * p.o_stride[1] + hh * p.o_stride[2] + c, p.o_f16);
      if (fv[c] != 0.f) d_term = e5m2_to_float(v1) * o / fv[c];  // fv = 0: V's channel is 0
    }
    d_term = warp_sum(d_term);
    if (threadIdx.x % 32 == 0) d_part[il][c / 32] = d_term;
    p.do_v[(bh * p.s_q_pad + i) * D + c] = v1;
    const int pos = int(transposed_position_of_query(il));
    t_do[c][pos] = v2;
    t_q[c][pos] = qb;
  }
  __syncthreads();
  if (threadIdx.x < kBlockQueries) {
    const int64_t i = int64_t(blk) * kBlockQueries + threadIdx.x;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < D / 32; ++w) sum += d_part[threadIdx.x][w];
    if (i < p.s_q) p.dsum[bh * p.s_q + i] = mul_pow2(sum, -g_dp);
  }
  constexpr int kWords = kBlockQueries / 4;
  for (int idx = threadIdx.x; idx < D * kWords; idx += kThreads) {
    const int c = idx / kWords, w = idx % kWords;
    const int64_t off = (bh * D + c) * p.s_q_pad + int64_t(blk) * kBlockQueries + 4 * w;
    *reinterpret_cast<uint32_t*>(p.do_t + off) =
        *reinterpret_cast<const uint32_t*>(&t_do[c][4 * w]);
    *reinterpret_cast<uint32_t*>(p.q_t + off) = *reinterpret_cast<const uint32_t*>(&t_q[c][4 * w]);
  }
}

}  // namespace

cudaError_t launch_prep_quant(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t n = int64_t(p.b) * p.h * (p.s_q_pad / kBlockQueries);
  if (n == 0) return cudaSuccess;
  if (d == 128) {
    prep_quant_kernel<128><<<unsigned(n), kThreads, 0, stream>>>(p);
  } else {
    prep_quant_kernel<64><<<unsigned(n), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
