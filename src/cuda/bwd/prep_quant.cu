// Backward preprocess, pass 2: per (batch, head, block of 32 queries), the FP8 operands that the
// main kernel loads by TMA for its wgmmas (numerics.md §8):
//  * do_v = E5M2(2^g' dO_ic v_scale_c), row-major [query][channel] (B operand of dP^T = V dO^T);
//  * do_t = E5M2(2^g dO_ic), transposed [channel][query] (B operand of dV = P^T dO);
//  * q_t  = Q's E4M3 bytes, transposed (B operand of dK = dS^T Q);
//  * D = sum_c dO'_ic O_ic with dO' the dO that dP sees (do_v's E5M2 value, 2^g' and v_scale
//    undone), so that the rows of dS sum to ~0 as in exact arithmetic (numerics.md §8);
// the transposed ones with each 16-query group in the permuted order of bits.h. The
// roundings are the golden model's codecs (formats.h; E5M2 through the hardware conversion, which
// equals float_to_e5m2 on finite floats), so the bytes equal its operands.
#include "cuda/bwd/bits.h"
#include "cuda/bwd/device.cuh"
#include "cuda/bwd/kernels.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn::bwd {
namespace {

constexpr int kThreads = 128;

// E5M2 codes of two floats, lo in bits 0..7: the hardware conversion (RNE, saturating to 57344),
// equal to float_to_e5m2 on every finite float (tests/cuda/test_e4m3_hw.cu); non-finite inputs
// take the codec (Inf stays Inf, NaN gets its code).
__device__ __forceinline__ uint32_t e5m2x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  if (!(isfinite(lo) && isfinite(hi))) {
    return uint32_t(float_to_e5m2(lo)) | uint32_t(float_to_e5m2(hi)) << 8;
  }
  return r;
}

// The value of an E5M2 code: the high byte of the FP16 with the same bits (exact, NaN and Inf
// included).
__device__ __forceinline__ float e5m2_value(uint32_t code) {
  return __half2float(__ushort_as_half(uint16_t((code & 0xFFu) << 8)));
}
// Rows of the transposed tiles padded by 4 bytes: a warp's byte stores (16 or 8 threads of a row,
// 8 channels each) then spread over 8 banks instead of one.
constexpr int kTPitch = kPrepQueries + 4;

template <int D>
__global__ void __launch_bounds__(kThreads) prep_quant_kernel(BwdParams p) {
  constexpr int kLanes = D / 8;  // threads per query row, 8 channels each
  constexpr int kRowsPerPass = kThreads / kLanes;
  __shared__ __align__(16) uint8_t t_do[D][kTPitch];
  __shared__ __align__(16) uint8_t t_q[D][kTPitch];
  const int blocks = p.s_q_pad / kPrepQueries;
  const int blk = int(blockIdx.x % blocks);
  const int64_t bh = blockIdx.x / blocks;  // b * h + head
  const int bb = int(bh / p.h), hh = int(bh % p.h);
  const int hk = hh / (p.h / p.h_kv);
  const float* rec = p.amax + bh * kAmaxSlots;
  const int g_dp = pow2_scale_exp(rec[kAmaxDoFv], kE5m2Top);
  const Pow2 to_do(pow2_scale_exp(rec[kAmaxDo], kE5m2Top)), to_dp(g_dp);  // mul_pow2's bits
  const int c0 = (int(threadIdx.x) % kLanes) * 8;
  float fv[8], inv_fv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    fv[e] = p.v_scale[(int64_t(bb) * p.h_kv + hk) * D + c0 + e];
    inv_fv[e] = fv[e] != 0.f ? 1.f / fv[e] : 0.f;
  }
  for (int il = int(threadIdx.x) / kLanes; il < kPrepQueries; il += kRowsPerPass) {
    const int64_t i = int64_t(blk) * kPrepQueries + il;
    uint8_t v1[8] = {}, v2[8] = {}, qb[8] = {};
    float d_term = 0.f;
    if (i < p.s_q) {
      float g[8], o[8];
      load8x16(p.dout + bb * p.do_stride[0] + i * p.do_stride[1] + hh * p.do_stride[2] + c0,
               p.do_f16, g);
      load8x16(p.o + bb * p.o_stride[0] + i * p.o_stride[1] + hh * p.o_stride[2] + c0, p.o_f16, o);
      const uint2 qw = *reinterpret_cast<const uint2*>(p.q + (bh * p.s_q + i) * D + c0);
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const uint32_t c1 = e5m2x2(to_dp(g[e] * fv[e]), to_dp(g[e + 1] * fv[e + 1]));
        const uint32_t c2 = e5m2x2(to_do(g[e]), to_do(g[e + 1]));
        v1[e] = uint8_t(c1);
        v1[e + 1] = uint8_t(c1 >> 8);
        v2[e] = uint8_t(c2);
        v2[e + 1] = uint8_t(c2 >> 8);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        qb[e] = uint8_t((e < 4 ? qw.x : qw.y) >> (8 * (e % 4)));
        // D's dO is the one dP sees: do_v's E5M2 value with v_scale undone (by its reciprocal;
        // fv = 0: V's channel is 0 and adds nothing).
        if (fv[e] != 0.f) d_term += e5m2_value(v1[e]) * o[e] * inv_fv[e];
      }
    }
    // The row's D: the kLanes partial sums of 8 channels, by a butterfly in a fixed order.
#pragma unroll
    for (int m = 1; m < kLanes; m <<= 1) d_term += __shfl_xor_sync(0xffffffffu, d_term, m);
    if (c0 == 0 && i < p.s_q) p.dsum[bh * p.s_q + i] = mul_pow2(d_term, -g_dp);
    uint2 w1;
    w1.x = uint32_t(v1[0]) | uint32_t(v1[1]) << 8 | uint32_t(v1[2]) << 16 | uint32_t(v1[3]) << 24;
    w1.y = uint32_t(v1[4]) | uint32_t(v1[5]) << 8 | uint32_t(v1[6]) << 16 | uint32_t(v1[7]) << 24;
    *reinterpret_cast<uint2*>(p.do_v + (bh * p.s_q_pad + i) * D + c0) = w1;
    const int pos = int(transposed_position_of_query(il));
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      t_do[c0 + e][pos] = v2[e];
      t_q[c0 + e][pos] = qb[e];
    }
  }
  __syncthreads();
  constexpr int kWords = kPrepQueries / 4;
  for (int idx = threadIdx.x; idx < D * kWords; idx += kThreads) {
    const int c = idx / kWords, w = idx % kWords;
    const int64_t off = (bh * D + c) * p.s_q_pad + int64_t(blk) * kPrepQueries + 4 * w;
    *reinterpret_cast<uint32_t*>(p.do_t + off) =
        *reinterpret_cast<const uint32_t*>(&t_do[c][4 * w]);
    *reinterpret_cast<uint32_t*>(p.q_t + off) = *reinterpret_cast<const uint32_t*>(&t_q[c][4 * w]);
  }
}

}  // namespace

cudaError_t launch_prep_quant(const BwdParams& p, int d, cudaStream_t stream) {
  const int64_t n = int64_t(p.b) * p.h * (p.s_q_pad / kPrepQueries);
  if (n == 0) return cudaSuccess;
  if (d == 128) {
    prep_quant_kernel<128><<<unsigned(n), kThreads, 0, stream>>>(p);
  } else {
    prep_quant_kernel<64><<<unsigned(n), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace fp4attn::bwd
