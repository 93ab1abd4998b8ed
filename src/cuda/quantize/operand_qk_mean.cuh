// Pass 1 of smoothed K: the per-channel mean of each (b, h) slice, bit for bit golden::smooth_keys
// (the sum in double in token order, then BF16_RNE(float(sum / s))). A sum in another order
// could round differently, so the parallel kernels below are used only where the sum is provably
// exact (then every order gives it); other channels take the token-order chain.
// Launched by launch_k_mean (operand_qk_mean.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/bf16_rne.h"
#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_host_nan.cuh"
#include "cuda/quantize/operand_qk_input.cuh"

namespace fp4attn::detail::qk_operand {

// sum_t x[t, c] in double in token order, as golden::smooth_keys (host_add), for the column p.
// Fast chain: plain FP64 adds (bound by this dependent chain's latency). Without NaNs they are
// host_add exactly; a NaN anywhere leaves the sum NaN, and then the chain is recomputed with
// host_add's x86 NaN selection (which NaN comes out depends on the order).
template <bool kF16>
__device__ double sequential_sum(const XArgs& a, const uint16_t* p) {
  double acc = 0.0;
  int64_t t = 0;
  constexpr int kUnroll = 32;  // loads in flight per thread: the pass is latency-bound
  for (; t + kUnroll <= a.s; t += kUnroll) {
    uint16_t r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = __ldg(p + (t + u) * a.stride_s);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      acc = __dadd_rn(acc, static_cast<double>(load_plain_value<kF16>(r[u])));
    }
  }
  for (; t < a.s; ++t) {
    acc = __dadd_rn(acc, static_cast<double>(load_plain_value<kF16>(__ldg(p + t * a.stride_s))));
  }
  if (f64_is_nan(acc)) {
    acc = 0.0;
    for (t = 0; t < a.s; ++t) {
      acc = host_add(acc, host_f2d(load_value<kF16>(__ldg(p + t * a.stride_s))));
    }
  }
  return acc;
}

// BF16_RNE(float(sum / s)) as a float; 0 when s == 0.
__device__ __forceinline__ float mean_of(double sum, int64_t s) {
  if (s <= 0) return 0.f;
  const float q = host_d2f(__ddiv_rn(sum, static_cast<double>(s)));
  return __uint_as_float(bf16_rne_bits(q) << 16);
}

// mean[bh, c] = BF16_RNE(float(sum_t x[t, c] / s)) with the sum in double in token order
// (golden::smooth_keys); 0 when s == 0. One thread per (b, h, channel): used when the parallel
// path is off (kParallelMean).
template <bool kF16>
__global__ void __launch_bounds__(kThreads) mean_kernel(XArgs a, int d, float* __restrict__ mean) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= a.nbh * d) return;
  const int64_t bh = idx / d, c = idx % d;
  const uint16_t* p = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h + c;
  mean[idx] = mean_of(sequential_sum<kF16>(a, p), a.s);
}

// Parallel K mean, bit-identical to the token-order double sum whenever that sum is exact:
// every value is a multiple of 2^L (L: the smallest ulp among the channel's nonzero values) and
// every partial sum, in any order or grouping, is bounded by sum |x| < s * 2^(emax + 1), so when
// ceil(log2 s) + Emax - Emin <= 52 - M (exponent fields, subnormals as 1; M mantissa bits: 7 BF16,
// 10 FP16) all partial sums are integers times 2^L below 2^(L + 53): exactly representable,
// so no addition rounds and every order gives the exact sum, the sequential one included.
// Channels failing that test (or holding Inf/NaN) are summed sequentially by mean_finish_kernel.
constexpr bool kParallelMean = true;
constexpr int kMeanSeg = 1024;  // tokens per partial sum

struct alignas(16) MeanPartial {
  double sum;         // the segment's sum (exact when the channel passes the test)
  uint32_t max_bits;  // max |x| 16-bit bits (NaN/Inf above every finite value)
  uint32_t min_exp;   // min exponent field over the nonzero values (0xFFFF: none)
};

template <bool kF16>
__global__ void __launch_bounds__(kThreads)
    mean_partial_kernel(XArgs a, int d, int nseg, MeanPartial* __restrict__ part) {
  constexpr int kM = kF16 ? 10 : 7;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= a.nbh * nseg * d) return;
  const int64_t c = idx % d, rest = idx / d;
  const int64_t seg = rest % nseg, bh = rest / nseg;
  const uint16_t* p = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h + c;
  const int64_t t0 = seg * kMeanSeg, t1 = min(a.s, t0 + kMeanSeg);
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  uint32_t mx = 0, mn = 0xFFFFu;
  int64_t t = t0;
  constexpr int kUnroll = 16;
  for (; t + kUnroll <= t1; t += kUnroll) {
    uint16_t r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = __ldg(p + (t + u) * a.stride_s);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t h = r[u] & 0x7FFFu;
      mx = max(mx, h);
      mn = min(mn, h != 0 ? h >> kM : 0xFFFFu);
      acc[u % 4] = __dadd_rn(acc[u % 4], static_cast<double>(load_plain_value<kF16>(r[u])));
    }
  }
  for (; t < t1; ++t) {
    const uint16_t r = __ldg(p + t * a.stride_s);
    const uint32_t h = r & 0x7FFFu;
    mx = max(mx, h);
    mn = min(mn, h != 0 ? h >> kM : 0xFFFFu);
    acc[0] = __dadd_rn(acc[0], static_cast<double>(load_plain_value<kF16>(r)));
  }
  part[idx] = MeanPartial{__dadd_rn(__dadd_rn(acc[0], acc[1]), __dadd_rn(acc[2], acc[3])), mx, mn};
}

// The same partials for kD in {64, 128}, one CTA per (bh, segment): thread = 8 channels (one
// 16-byte load per token) x one of kLanes token lanes (tokens t0 + lane + k * kLanes), the lanes
// then combined in shared memory. The grouping differs from mean_partial_kernel's, which is
// harmless: a partial only counts when the channel passes the exact-sum test, and then every
// grouping gives the exact sum. Max / min-exponent as packed 16-bit maxima / minima.
constexpr int kMeanSegVec = 512;  // tokens per CTA

template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, 3)  // registers for 8 x 16 bytes in flight per thread
    mean_partial_vec_kernel(XArgs a, int nseg, MeanPartial* __restrict__ part) {
  constexpr int kM = kF16 ? 10 : 7;
  constexpr uint32_t kEMask = kF16 ? 0x001F001Fu : 0x00FF00FFu;
  constexpr int kGroups = kD / 8, kLanes = kThreads / kGroups;
  __shared__ double sum_s[kLanes * kD];
  __shared__ uint16_t mx_s[kLanes * kD], mn_s[kLanes * kD];
  const int64_t cta = blockIdx.x;
  const int64_t seg = cta % nseg, bh = cta / nseg;
  const int g = threadIdx.x % kGroups, lane = threadIdx.x / kGroups;
  const int64_t t0 = seg * kMeanSegVec, t1 = min(a.s, t0 + kMeanSegVec);
  const uint16_t* p = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h + 8 * g;
  double acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0;
  uint32_t mx[4] = {0, 0, 0, 0}, mn[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
  auto step = [&](const uint4& r) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t m = w[q] & 0x7FFF7FFFu;
      mx[q] = __vmaxu2(mx[q], m);
      mn[q] = __vminu2(mn[q], ((m >> kM) & kEMask) | __vcmpeq2(m, 0u));
      float lo, hi;
      if constexpr (kF16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
        lo = f.x;
        hi = f.y;
      } else {
        lo = __uint_as_float(w[q] << 16);
        hi = __uint_as_float(w[q] & 0xFFFF0000u);
      }
      acc[2 * q] = __dadd_rn(acc[2 * q], static_cast<double>(lo));
      acc[2 * q + 1] = __dadd_rn(acc[2 * q + 1], static_cast<double>(hi));
    }
  };
  constexpr int kUnroll = 8;
  int64_t t = t0 + lane;
  for (; t + (kUnroll - 1) * kLanes < t1; t += kUnroll * kLanes) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      r[u] = __ldg(reinterpret_cast<const uint4*>(p + (t + u * kLanes) * a.stride_s));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) step(r[u]);
  }
  for (; t < t1; t += kLanes) step(__ldg(reinterpret_cast<const uint4*>(p + t * a.stride_s)));
#pragma unroll
  for (int i = 0; i < 8; ++i) sum_s[lane * kD + 8 * g + i] = acc[i];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int i = lane * kD + 8 * g + 2 * q;
    mx_s[i] = static_cast<uint16_t>(mx[q]);
    mx_s[i + 1] = static_cast<uint16_t>(mx[q] >> 16);
    mn_s[i] = static_cast<uint16_t>(mn[q]);
    mn_s[i + 1] = static_cast<uint16_t>(mn[q] >> 16);
  }
  __syncthreads();
  if (threadIdx.x < kD) {
    const int c = threadIdx.x;
    double s0 = 0.0, s1 = 0.0;
    uint32_t x = 0, n = 0xFFFFu;
#pragma unroll
    for (int l = 0; l < kLanes; l += 2) {
      s0 = __dadd_rn(s0, sum_s[l * kD + c]);
      s1 = __dadd_rn(s1, sum_s[(l + 1) * kD + c]);
      x = max(x, max(uint32_t{mx_s[l * kD + c]}, uint32_t{mx_s[(l + 1) * kD + c]}));
      n = min(n, min(uint32_t{mn_s[l * kD + c]}, uint32_t{mn_s[(l + 1) * kD + c]}));
    }
    part[cta * kD + c] = MeanPartial{__dadd_rn(s0, s1), x, n};
  }
}

template <bool kF16>
__global__ void __launch_bounds__(kThreads, 1)  // few CTAs: registers for loads in flight
    mean_finish_kernel(XArgs a, int d, int nseg, const MeanPartial* __restrict__ part,
                       float* __restrict__ mean) {
  constexpr int kM = kF16 ? 10 : 7;
  constexpr uint32_t kInfBits = kF16 ? 0x7C00u : 0x7F80u;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= a.nbh * d) return;
  const int64_t bh = idx / d, c = idx % d;
  double acc = 0.0;
  uint32_t mx = 0, mn = 0xFFFFu;
  // Any order of the partials gives the same sum when the channel passes the test below (and
  // the sum is recomputed when it fails): loads batched kBatch at a time.
  constexpr int kBatch = 16;
  const MeanPartial* pp = part + bh * nseg * d + c;
  int seg = 0;
  for (; seg + kBatch <= nseg; seg += kBatch) {
    uint4 q[kBatch];  // MeanPartial as one 16-byte load (cudaMallocAsync: 256-byte aligned)
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      q[u] = __ldg(reinterpret_cast<const uint4*>(pp + static_cast<int64_t>(seg + u) * d));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      acc = __dadd_rn(acc, __hiloint2double(static_cast<int>(q[u].y), static_cast<int>(q[u].x)));
      mx = max(mx, q[u].z);
      mn = min(mn, q[u].w);
    }
  }
  for (; seg < nseg; ++seg) {
    const MeanPartial q = pp[static_cast<int64_t>(seg) * d];
    acc = __dadd_rn(acc, q.sum);
    mx = max(mx, q.max_bits);
    mn = min(mn, q.min_exp);
  }
  const int log2s = a.s <= 1 ? 0 : 64 - __clzll(static_cast<long long>(a.s - 1));
  const int emax = max(static_cast<int>(mx >> kM), 1);
  const int emin = max(static_cast<int>(mn), 1);
  const bool exact = mx < kInfBits && log2s + emax - emin <= 52 - kM;
  if (!exact) {
    const uint16_t* p = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h + c;
    acc = sequential_sum<kF16>(a, p);
  }
  mean[idx] = mean_of(acc, a.s);
}

}  // namespace fp4attn::detail::qk_operand
