// Q/K kernel operands on the GPU (operands.h layouts): data [b, h, s, d] E4M3 (BF16 for bf16),
// scale FP32 [b, h, ceil(s / 128)], optional K mean [b, h, d]. The bytes equal
// quantize_operand_host's: every rounding goes through the FP4ATTN_HD functions of formats.h /
// quantize.h, in the order of golden_operands.cc.
//
// Passes (all on `stream`):
//   1. smooth_k only: mean_kernel, one thread per (b, h, channel), summing the s tokens in double
//      in token order, exactly as golden::smooth_keys (a sum in another order could round
//      differently), then BF16_RNE(float(sum / s)) into `mean`. By default the sum is parallel
//      (mean_partial_vec_kernel / mean_partial_kernel + mean_finish_kernel) wherever it is provably
//      exact, hence identical; other channels fall back to the token-order chain.
//   2. computed NVFP4 s_enc or mxfp4: slice_max_kernel, a per-(b, h) max over the (smoothed)
//      slice into FP32-sized scratch words: NVFP4: the NaN-propagating amax (max of |x| bits);
//      mxfp4: the largest finite block amax (+1, 0 = none), whose block exponent is the
//      slice's largest (the MX exponent is non-decreasing in the block amax).
//   3. quantize: one thread per 16-element NVFP4 block (32 for MX, 16 values for bf16), two
//      16-byte loads, the HD block quantizer, the folded E4M3 bytes in 16-byte stores; fp8: one
//      CTA per 128-token tile (amax over the whole 128 x d tile in shared memory, then codes).
//      NVFP4: nvfp4_slice_setup_kernel first (s_enc, 8 / s_enc and the scale table per slice, so
//      the block kernel has no division), then nvfp4_operand_kernel (up to 8 blocks per thread),
//      and nvfp4_operand_generic_kernel for slices without a finite table.
//
// Speed (operand_qk_fast.cuh): inputs unpacked without NaN quieting where only NaN-ness matters,
// block amax as packed 16-bit integer maxima, NVFP4 blocks by nvfp4_operand_kernel (a per-CTA
// table of s_enc / scale, exact short scale encodes, packed::four_over_six shared with the packed
// quantizer), MX blocks by packed::mxfp4_block, the fold E4M3(e2m1 * factor) through
// per-scale-code byte tables (fold_table_kernel) selected with PRMT, fp8 codes by the exact
// e4m3x4_finite, the K mean as a plain FP64 chain (recomputed with x86 NaN rules only when NaN).
//
// Host NaN semantics: the reference reads inputs through float -> double -> float (x86 quiets
// signaling NaNs) and smooths with a double subtraction. Only the bf16 recipe and the K mean
// keep NaN payloads, so those are reproduced bit for bit (quieting, x86's operand order and its
// default NaN 0xFFC00000 for Inf - Inf); every other output maps NaN to a fixed code.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/packed_blocks.cuh"  // packed::nvfp4_fill_scale_table, nvfp4_table_finite
#include "cuda/quantize/validate_cuda.h"
#include "fp4attn/formats.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/quantize.h"

namespace fp4attn::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;
constexpr int64_t kMaxGridX = int64_t{1} << 30;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu, kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;
constexpr uint32_t kX86DefaultNanF32 = 0xFFC00000u;
constexpr uint64_t kX86DefaultNanF64 = 0xFFF8000000000000ull;

// The input tensor: BSHD 16-bit values, strides in elements.
struct XArgs {
  const uint16_t* x;
  int64_t stride_b, stride_s, stride_h;
  int64_t s;
  int64_t h;
  int64_t nbh;  // b * h
};

__device__ __forceinline__ bool f32_is_nan(float v) {
  return (__float_as_uint(v) & kF32AbsMask) > kF32Inf;
}

// A 16-bit input as the host reads it: exact, NaNs quieted (the float -> double conversion).
template <bool kF16>
__device__ __forceinline__ float load_value(uint32_t h16) {
  if constexpr (kF16) {
    const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(h16)));
    const uint32_t nan = ((h16 & 0x8000u) << 16) | kF32Inf | kF32QuietBit | ((h16 & 0x3FFu) << 13);
    return (h16 & 0x7FFFu) > 0x7C00u ? __uint_as_float(nan) : f;
  } else {
    uint32_t u = h16 << 16;
    if ((u & kF32AbsMask) > kF32Inf) u |= kF32QuietBit;
    return __uint_as_float(u);
  }
}

// A 16-bit input as a float, NaNs unquieted (only whether it is NaN is used).
template <bool kF16>
__device__ __forceinline__ float load_plain_value(uint32_t h16) {
  if constexpr (kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h16)));
  } else {
    return __uint_as_float(h16 << 16);
  }
}

// float(double(x) - double(m)) on x86: one FP32 subtraction for numbers (double rounding through
// FP64 is innocuous for a subtraction), x's NaN first, then m's, Inf - Inf the default NaN.
__device__ __forceinline__ float host_sub(float x, float m) {
  if (f32_is_nan(x)) return x;
  if (f32_is_nan(m)) return m;
  const float r = __fsub_rn(x, m);
  return f32_is_nan(r) ? __uint_as_float(kX86DefaultNanF32) : r;
}

// kN consecutive values of one row (p 16-byte aligned), smoothed when mean_c is not null.
template <bool kF16, int kN>
__device__ __forceinline__ void load_chunk(const uint16_t* p, const float* mean_c, float* v) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const uint4 r = __ldg(reinterpret_cast<const uint4*>(p) + j);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[8 * j + 2 * q] = load_value<kF16>(w[q] & 0xFFFFu);
      v[8 * j + 2 * q + 1] = load_value<kF16>(w[q] >> 16);
    }
  }
  if (mean_c != nullptr) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = host_sub(v[i], __ldg(mean_c + i));
  }
}

// kN consecutive values of one row as plain floats (no NaN quieting) minus mean_c[i] (a plain FP32
// subtraction) when mean_c is not null. For every output except bf16 and the mean only whether a
// value is NaN matters, and the plain ops give NaN exactly when host_sub / load_value do; numbers
// are identical.
template <bool kF16, int kN>
__device__ __forceinline__ void unpack_plain(const uint4* r, const float* mean_c, float* v);

template <bool kF16, int kN>
__device__ __forceinline__ void load_plain(const uint16_t* p, const float* mean_c, float* v) {
  uint4 r[kN / 8];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
  unpack_plain<kF16, kN>(r, mean_c, v);
}

// The same from kN / 8 raw 16-byte vectors already loaded.
template <bool kF16, int kN>
__device__ __forceinline__ void unpack_plain(const uint4* r, const float* mean_c, float* v) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) operand_fast::unpack8<kF16>(r[j], v + 8 * j);
  if (mean_c != nullptr) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = __fsub_rn(v[i], __ldg(mean_c + i));
  }
}

// Max |x| FP32 bits of kN / 8 raw 16-byte vectors (see raw_amax_bits).
template <bool kF16, int kN>
__device__ __forceinline__ uint32_t raw_amax_bits_of(const uint4* r) {
  uint32_t acc = 0;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    acc = operand_fast::abs_max2(acc, r[j].x);
    acc = operand_fast::abs_max2(acc, r[j].y);
    acc = operand_fast::abs_max2(acc, r[j].z);
    acc = operand_fast::abs_max2(acc, r[j].w);
  }
  return operand_fast::abs_max2_to_f32_bits<kF16>(acc);
}

// Max |x| FP32 bits of kN raw 16-bit values (NaN-propagating: NaN bits > Inf > finite), through
// packed 16-bit maxima.
template <bool kF16, int kN>
__device__ __forceinline__ uint32_t raw_amax_bits(const uint16_t* p) {
  uint4 r[kN / 8];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
  return raw_amax_bits_of<kF16, kN>(r);
}

// 16 bytes -> one 16-byte store.
__device__ __forceinline__ void store16(void* dst, const uint8_t* b) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[q] = uint32_t{b[4 * q]} | (uint32_t{b[4 * q + 1]} << 8) | (uint32_t{b[4 * q + 2]} << 16) |
           (uint32_t{b[4 * q + 3]} << 24);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Block-wide max of a uint32 (every thread of the block calls it; the result is for all).
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* smem) {
  v = __reduce_max_sync(0xFFFFFFFFu, v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // smem reuse across loop iterations
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  uint32_t m = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, smem[w]);
  return m;
}

// ---- pass 1: K mean -----------------------------------------------------------------------------

// double(float) and float(double) as x86 converts them (payload kept, quiet bit set).
__device__ __forceinline__ double host_f2d(float v) {
  const uint32_t u = __float_as_uint(v);
  if ((u & kF32AbsMask) > kF32Inf) {
    const uint64_t d = (uint64_t{u >> 31} << 63) | (uint64_t{0x7FF} << 52) |
                       (uint64_t{u & 0x7FFFFFu} << 29) | (uint64_t{1} << 51);
    return __longlong_as_double(static_cast<long long>(d));
  }
  return static_cast<double>(v);
}

__device__ __forceinline__ float host_d2f(double v) {
  const uint64_t d = static_cast<uint64_t>(__double_as_longlong(v));
  if ((d & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) {
    return __uint_as_float(static_cast<uint32_t>((d >> 63) << 31) | kF32Inf | kF32QuietBit |
                           static_cast<uint32_t>((d >> 29) & 0x7FFFFFu));
  }
  return __double2float_rn(v);
}

__device__ __forceinline__ bool f64_is_nan(double v) {
  return (static_cast<uint64_t>(__double_as_longlong(v)) & 0x7FFFFFFFFFFFFFFFull) >
         0x7FF0000000000000ull;
}

// acc + v in double as `mean[c] += v` computes it on x86 (acc's NaN first).
__device__ __forceinline__ double host_add(double acc, double v) {
  if (f64_is_nan(acc)) return acc;
  if (f64_is_nan(v)) return v;
  const double r = __dadd_rn(acc, v);
  return f64_is_nan(r) ? __longlong_as_double(static_cast<long long>(kX86DefaultNanF64)) : r;
}

// BF16_RNE of a float as float_to_bf16_bits (NaN: quiet bit, payload truncated), as a float.
__device__ __forceinline__ uint16_t host_bf16_bits(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

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
  return __uint_as_float(uint32_t{host_bf16_bits(q)} << 16);
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

// ---- pass 2: per-slice maxima -------------------------------------------------------------------

// Unit u of a slice: token u / (kD / kBlk), block u % (kD / kBlk).
template <int kD, int kBlk>
__device__ __forceinline__ const uint16_t* row_chunk(const XArgs& a, int64_t bh, int64_t token,
                                                     int blk) {
  return a.x + (bh / a.h) * a.stride_b + token * a.stride_s + (bh % a.h) * a.stride_h + blk * kBlk;
}

// kMx false: max |x| bits of the slice (NaN-propagating amax). kMx true: max over the 32-element
// blocks with a finite amax of (amax bits + 1); 0 when there is none. out zeroed beforehand.
template <bool kF16, int kD, bool kMx>
__global__ void __launch_bounds__(kThreads)
    slice_max_kernel(XArgs a, const float* __restrict__ mean, uint32_t* __restrict__ out) {
  constexpr int kBlk = kMx ? kMxfp4Block : kNvfp4Block;
  constexpr int kNb = kD / kBlk;
  __shared__ uint32_t smem[kThreads / 32];
  const int64_t units = a.s * kNb;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    uint32_t m = 0;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < units;
         base += static_cast<int64_t>(gridDim.x) * kThreads) {
      const int64_t u = base + threadIdx.x;
      if (u < units) {
        const int64_t token = u / kNb;
        const int blk = static_cast<int>(u % kNb);
        const uint16_t* p = row_chunk<kD, kBlk>(a, bh, token, blk);
        uint32_t amax;
        if (mean == nullptr) {
          amax = raw_amax_bits<kF16, kBlk>(p);
        } else {
          float v[kBlk];
          load_plain<kF16, kBlk>(p, mean + bh * kD + blk * kBlk, v);
          amax = float_bits(block_amax(v, kBlk));
        }
        if constexpr (kMx) {
          if (amax < kF32Inf) m = max(m, amax + 1u);
        } else {
          m = max(m, amax);
        }
      }
    }
    m = block_max(m, smem);
    if (threadIdx.x == 0 && m != 0) atomicMax(out + bh, m);
  }
}

// The folded bytes of one NVFP4 block by the generic reference functions (any s_enc, e.g. a
// static scale beyond packed::nvfp4_table_finite). Out of line: rarely run.
template <Nvfp4ScaleRule kRule>
__device__ __noinline__ void nvfp4_fold_generic(const float* v, float s_enc, uint8_t* dst) {
  uint8_t codes[kNvfp4Block];
  const uint8_t sc = nvfp4_quantize_block(v, kNvfp4Block, s_enc, kRule, codes);
  // E4M3_RNE(e2m1 * scale / 8): the product and the / 8 are exact in FP32.
  const float f = e4m3_to_float(sc);
  uint8_t bytes[kNvfp4Block];
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) {
    bytes[i] =
        sc == 0x7F
            ? uint8_t{0x7F}
            : float_to_e4m3(detail::mul_rn(detail::mul_rn(e2m1_to_float(codes[i]), f), 0.125f));
  }
  store16(dst, bytes);
}

// The folded bytes of the block in the raw vectors r0, r1 (minus mean_c[i] when not null) by
// nvfp4_fold_generic (slices whose static s_enc is beyond packed::nvfp4_table_finite).
template <bool kF16, Nvfp4ScaleRule kRule>
__device__ __noinline__ uint4 nvfp4_fold_generic_raw(uint4 r0, uint4 r1, const float* mean_c,
                                                     float s_enc) {
  float v[kNvfp4Block];
  operand_fast::unpack8<kF16>(r0, v);
  operand_fast::unpack8<kF16>(r1, v + 8);
  if (mean_c != nullptr) {
    for (int i = 0; i < kNvfp4Block; ++i) v[i] = __fsub_rn(v[i], __ldg(mean_c + i));
  }
  uint4 o;
  nvfp4_fold_generic<kRule>(v, s_enc, reinterpret_cast<uint8_t*>(&o));
  return o;
}

// ---- fold tables -------------------------------------------------------------------------------

// Row sc: the 8 folded bytes of NVFP4 scale code sc; row k + 248: MXFP4 offset k
// (operand_qk_fast.cuh). Rewritten with the same values by every launch of fold_table_kernel
// (idempotent).
__device__ uint2 g_nv_fold[256];
__device__ uint2 g_mx_fold[operand_fast::kMxFoldRows];

__global__ void fold_table_kernel() {
  const int i = threadIdx.x;
  if (i < 256) {
    const uint64_t r = operand_fast::nvfp4_fold_row(static_cast<uint32_t>(i));
    g_nv_fold[i] = make_uint2(static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32));
  } else if (i - 256 < operand_fast::kMxFoldRows) {
    const uint64_t r = operand_fast::mxfp4_fold_row(i - 256 + operand_fast::kMxFoldMinK);
    g_mx_fold[i - 256] = make_uint2(static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32));
  }
}

// ---- pass 3: quantization -----------------------------------------------------------------------

enum class Mode { kBf16, kMx };  // NVFP4: nvfp4_operand_kernel

// 2^t as a float, t in [-149, 127].
__device__ __forceinline__ float pow2_float(int t) {
  return t >= -126 ? detail::pow2_normal(t) : __uint_as_float(1u << (t + 149));
}

// One thread per block of kBlk elements of a row; the scale of each 128-token tile is written by
// the thread of its first token's block 0.
// kSmooth: 1 / 0 when the launcher knows whether `mean` is set (separate code for the two cases
// avoids merging the smoothed and plain values into one set of registers), -1: tested here.
template <bool kF16, int kD, Mode kMode, Nvfp4ScaleRule kRule, int kSmooth = -1>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(XArgs a, const float* __restrict__ mean, const uint32_t* __restrict__ slice_max,
                    float static_s_enc, void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kBlk = kMode == Mode::kMx ? kMxfp4Block : kNvfp4Block;
  constexpr int kNb = kD / kBlk;
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    // The slice's factor (golden_operands.cc): mxfp4 2^t, bf16 1.
    float factor = 1.f;
    int t = 0;
    if constexpr (kMode == Mode::kMx) {
      const uint32_t m = slice_max[bh];
      if (m != 0) {
        // The block exponent of the largest finite block amax is the slice's largest.
        const float amax = bits_float(m - 1u);
        uint8_t unused;
        const int emax =
            static_cast<int>(mxfp4_quantize_block(&amax, 1, MxScaleRule::kRoundUp, &unused)) - 127;
        t = emax - 6;
      }
      factor = pow2_float(t);
    }
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < units;
         base += static_cast<int64_t>(gridDim.x) * kThreads) {
      const int64_t u = base + threadIdx.x;
      if (u >= units) continue;
      const int64_t token = u / kNb;
      const int blk = static_cast<int>(u % kNb);
      const uint16_t* src = row_chunk<kD, kBlk>(a, bh, token, blk);
      const bool smooth = kSmooth < 0 ? mean != nullptr : kSmooth == 1;
      const float* mean_c = smooth ? mean + bh * kD + blk * kBlk : nullptr;
      float v[kBlk];
      const int64_t out = (bh * a.s + token) * kD + blk * kBlk;  // element offset in data
      float amax = 0.f;  // block_amax(v) (NaN-propagating; a NaN's payload is irrelevant)
      if constexpr (kMode != Mode::kBf16) {
        uint4 r[kBlk / 8];
#pragma unroll
        for (int j = 0; j < kBlk / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(src) + j);
        unpack_plain<kF16, kBlk>(r, mean_c, v);
        amax =
            mean_c == nullptr ? bits_float(raw_amax_bits_of<kF16, kBlk>(r)) : block_amax(v, kBlk);
      }
      if constexpr (kMode == Mode::kBf16) {
        load_chunk<kF16, kBlk>(src, mean_c, v);
        uint32_t w[kBlk / 2];
#pragma unroll
        for (int i = 0; i < kBlk / 2; ++i) {
          w[i] =
              uint32_t{host_bf16_bits(v[2 * i])} | (uint32_t{host_bf16_bits(v[2 * i + 1])} << 16);
        }
        uint4* dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(data) + out);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else {
        // Magnitudes through the fold row (PRMT selectors), signs XORed in from the values' top
        // bytes wherever amax is finite and nonzero (operand_fast::mxfp4_operand_block).
        uint32_t o[8];
        operand_fast::mxfp4_operand_block(
            v, amax, t,
            [](int i) {
              const uint2 r = __ldg(g_mx_fold + i);
              return (uint64_t{r.y} << 32) | r.x;
            },
            o);
        uint4* dst = reinterpret_cast<uint4*>(static_cast<uint8_t*>(data) + out);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
      }
      if (blk == 0 && token % kOperandTileTokens == 0) {
        scale[bh * tiles + token / kOperandTileTokens] = factor;
      }
    }
  }
}

// One NVFP4 block (nvfp4_quantize_block, then the fold E4M3(e2m1 * scale / 8)) of the 16 values
// in r0, r1 (minus mu when kSmooth), as the 16 folded bytes. s_enc finite > 0 with
// packed::nvfp4_table_finite; table: packed::nvfp4_fill_scale_table(s_enc).
// The scale math is exact and short: amax on the 16-bit bits (kSmooth: of the FP32 differences),
// amax / 6 by div6_16bit (exact for 16-bit amax values; kSmooth: a division), E4M3 codes by
// packed::e4m3_code_*, s_enc / f from the table; E2M1 magnitudes by packed::e2m1_mag_term sums
// (Four-Over-Six: packed::four_over_six_select), folded through g_nv_fold rows with the magnitude
// nibbles as PRMT selectors, the signs XORed in from the input bits (fold8_mag).
template <bool kF16, Nvfp4ScaleRule kRule, bool kSmooth>
__device__ __forceinline__ uint4 nvfp4_operand_block(const uint4& r0, const uint4& r1,
                                                     const float (&mu)[kNvfp4Block], float s_enc,
                                                     const float2* table) {
  float x[kNvfp4Block];
  operand_fast::unpack8<kF16>(r0, x);
  operand_fast::unpack8<kF16>(r1, x + 8);
  float amax;
  if constexpr (kSmooth) {
#pragma unroll
    for (int i = 0; i < kNvfp4Block; ++i) x[i] = __fsub_rn(x[i], mu[i]);
    amax = block_amax(x, kNvfp4Block);
  } else {
    const uint4 r[2] = {r0, r1};
    amax = bits_float(raw_amax_bits_of<kF16, kNvfp4Block>(r));
  }
  if (!(float_bits(amax) < kF32Inf)) {  // NaN or Inf: scale NaN, every byte NaN
    return make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  }
  const float a6 = kSmooth ? detail::div_rn(amax, kE2m1Max) : packed::div6_16bit(amax);
  uint32_t mag[2], sc;
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    const packed::FosCodes c = packed::four_over_six_codes(amax, a6, s_enc);
    const float2 e6 = table[c.c6], e4 = table[c.c4];
    if (packed::four_over_six_fast_ok(c)) {
      sc = packed::four_over_six_select<false>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
    } else {  // tiny or saturated /6 scale: rare (a warp diverges only where it occurs)
      sc = packed::four_over_six_select<true>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
    }
  } else {
    const float sf = fminf(detail::mul_rn(a6, s_enc), bits_float(detail::kFltMaxBits));
    sc = packed::e4m3_code_for_rule<kRule>(sf);
    const float inv = table[sc].x;  // code 0: 0, and the codes are all +0
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t t[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) t[i] = packed::e2m1_mag_term(detail::mul_rn(x[8 * j + i], inv));
      mag[j] = packed::e2m1_pack8_magnitudes(t);
    }
  }
  uint32_t s[4];
  if constexpr (kSmooth) {
#pragma unroll
    for (int q = 0; q < 4; ++q) s[q] = operand_fast::sign_bytes4_f32(x + 4 * q);
  } else {
    s[0] = operand_fast::sign_bytes4_16(r0.x, r0.y);
    s[1] = operand_fast::sign_bytes4_16(r0.z, r0.w);
    s[2] = operand_fast::sign_bytes4_16(r1.x, r1.y);
    s[3] = operand_fast::sign_bytes4_16(r1.z, r1.w);
  }
  const uint32_t smask = sc != 0 ? 0x80808080u : 0u;
  const uint2 row = __ldg(g_nv_fold + sc);
  uint4 o;
  operand_fast::fold8_mag(mag[0], row.x, row.y, s[0], s[1], smask, o.x, o.y);
  operand_fast::fold8_mag(mag[1], row.x, row.y, s[2], s[3], smask, o.z, o.w);
  return o;
}

// The NVFP4 parameters of one (b, h) slice (or of all slices for a static s_enc), written by
// nvfp4_slice_setup_kernel so that the block kernels hold no division (their slow paths are calls,
// whose register convention cost the fast kernel registers and CTAs per SM).
struct Nvfp4Slice {
  float s_enc;
  float factor;   // golden_operands.cc: 8 / s_enc
  uint32_t fast;  // s_enc > 0 with packed::nvfp4_table_finite: nvfp4_operand_kernel, else generic
  uint32_t unused;
};

// One CTA of 128 threads per slice: its s_enc (static, or from the slice amax), factor and the
// table of packed::nvfp4_fill_scale_table.
template <Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(128)
    nvfp4_slice_setup_kernel(const uint32_t* __restrict__ slice_max, float static_s_enc,
                             Nvfp4Slice* __restrict__ slices, float2* __restrict__ tables) {
  const int64_t i = blockIdx.x;
  const float s_enc =
      static_s_enc != 0.f ? static_s_enc : nvfp4_tensor_scale(bits_float(slice_max[i]), kRule);
  packed::nvfp4_fill_scale_table(s_enc, tables + i * 128);
  if (threadIdx.x == 0) {
    const bool fast = s_enc > 0.f && packed::nvfp4_table_finite(s_enc);
    slices[i] = {s_enc, detail::div_rn(8.f, s_enc), fast ? 1u : 0u, 0u};
  }
}

// Register budget of nvfp4_operand_kernel as CTAs of kThreads per SM (the most ptxas fits without
// spills): Four-Over-Six 3 (80 registers), the single-candidate rules 4 (64). Occupancy is what
// keeps loads in flight here: every CTA of the bench streams its slice once.
template <Nvfp4ScaleRule kRule>
constexpr int nvfp4_operand_min_ctas() {
  if (kRule == Nvfp4ScaleRule::kFourOverSix) return 3;
  return 4;
}

// NVFP4 Q/K operands (nvfp4, nvfp4-hx, nvfp4-fast, nvfp4-all, fp4-direct): one 16-value block per
// thread and grid-stride step, several steps per thread (launch_nvfp4_operand sizes the grid), the
// next step's loads issued before this step's math. Per slice: the first loads, then the table
// from nvfp4_slice_setup_kernel into shared memory (its latency hidden behind the loads). A
// thread's block column is fixed (the stride is a multiple of d / 16): its addresses advance by
// fixed steps. Slices without a finite table
// (Nvfp4Slice::fast false) are left to nvfp4_operand_generic_kernel.
template <bool kF16, int kD, Nvfp4ScaleRule kRule, bool kSmooth>
__global__ void __launch_bounds__(kThreads, nvfp4_operand_min_ctas<kRule>())
    nvfp4_operand_kernel(XArgs a, const float* __restrict__ mean,
                         const Nvfp4Slice* __restrict__ slices, const float2* __restrict__ tables,
                         int64_t slice_step, void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kNb = kD / kNvfp4Block;
  static_assert(kThreads % kNb == 0);
  __shared__ float2 table[128];
  // kSmooth: the slice's channel means, read per block (16 registers fewer than keeping the
  // thread's 16 means live, which spilled at the 80-register budget).
  __shared__ __align__(16) float smean[kSmooth ? kD : 1];
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int blk = static_cast<int>(threadIdx.x % kNb);
  const int64_t u0 = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    const uint16_t* src = a.x + (bh / a.h) * a.stride_b + (bh % a.h) * a.stride_h +
                          blk * kNvfp4Block + u0 / kNb * a.stride_s;
    const int64_t src_step = stride / kNb * a.stride_s;
    uint8_t* dst = static_cast<uint8_t*>(data) + bh * a.s * kD + u0 * kNvfp4Block;
    uint4 n0 = make_uint4(0, 0, 0, 0), n1 = n0;
    if (u0 < units) {
      n0 = __ldg(reinterpret_cast<const uint4*>(src));
      n1 = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    }
    const int64_t si = bh * slice_step;
    __syncthreads();  // the previous slice's table (and mean) reads are done
    if (threadIdx.x < 128) table[threadIdx.x] = __ldg(tables + si * 128 + threadIdx.x);
    if (kSmooth && threadIdx.x < kD) smean[threadIdx.x] = __ldg(mean + bh * kD + threadIdx.x);
    const float s_enc = __ldg(&slices[si].s_enc), factor = __ldg(&slices[si].factor);
    const bool fast = __ldg(&slices[si].fast) != 0u;
    __syncthreads();
    if (!fast) continue;
    for (int64_t u = u0; u < units; u += stride, src += src_step, dst += stride * kNvfp4Block) {
      const uint4 r0 = n0, r1 = n1;
      if (u + stride < units) {
        n0 = __ldg(reinterpret_cast<const uint4*>(src + src_step));
        n1 = __ldg(reinterpret_cast<const uint4*>(src + src_step) + 1);
      }
      float mu[kNvfp4Block];
#pragma unroll
      for (int i = 0; i < kNvfp4Block; ++i) mu[i] = kSmooth ? smean[blk * kNvfp4Block + i] : 0.f;
      *reinterpret_cast<uint4*>(dst) =
          nvfp4_operand_block<kF16, kRule, kSmooth>(r0, r1, mu, s_enc, table);
      if (u % (kOperandTileTokens * kNb) == 0) {
        scale[bh * tiles + u / kNb / kOperandTileTokens] = factor;
      }
    }
  }
}

// The slices without a finite table (a static s_enc beyond packed::nvfp4_table_finite, or a
// computed one from a tiny slice amax): every block by the reference functions. Launched only when
// such a slice can exist; the others return at once.
template <bool kF16, int kD, Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(kThreads)
    nvfp4_operand_generic_kernel(XArgs a, const float* __restrict__ mean,
                                 const Nvfp4Slice* __restrict__ slices, int64_t slice_step,
                                 void* __restrict__ data, float* __restrict__ scale) {
  constexpr int kNb = kD / kNvfp4Block;
  const int64_t units = a.s * kNb;
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    const Nvfp4Slice sl = slices[bh * slice_step];
    if (sl.fast != 0u) continue;
    for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < units;
         u += stride) {
      const int64_t token = u / kNb;
      const int blk = static_cast<int>(u % kNb);
      const uint4* p =
          reinterpret_cast<const uint4*>(row_chunk<kD, kNvfp4Block>(a, bh, token, blk));
      const float* mean_c = mean != nullptr ? mean + bh * kD + blk * kNvfp4Block : nullptr;
      *reinterpret_cast<uint4*>(static_cast<uint8_t*>(data) + (bh * a.s + token) * kD +
                                blk * kNvfp4Block) =
          nvfp4_fold_generic_raw<kF16, kRule>(__ldg(p), __ldg(p + 1), mean_c, sl.s_enc);
      if (blk == 0 && token % kOperandTileTokens == 0) {
        scale[bh * tiles + token / kOperandTileTokens] = sl.factor;
      }
    }
  }
}

// fp8: one CTA per (b, h, 128-token tile); fp8_quantize_block over the whole tile (all of d):
// scale = amax / 448, code = E4M3(x * (448 / amax)); amax 0 -> scale 1, codes 0; NaN/Inf ->
// scale NaN, codes 0x7F.
template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, kD == 128 ? 3 : 4)
    fp8_tile_kernel(XArgs a, const float* __restrict__ mean, uint8_t* __restrict__ data,
                    float* __restrict__ scale) {
  constexpr int kNb = kD / kNvfp4Block;
  constexpr int kPerThread = kOperandTileTokens * kNb / kThreads;
  static_assert(kPerThread * kThreads == kOperandTileTokens * kNb);
  __shared__ uint32_t smem[kThreads / 32];
  const int64_t tiles = (a.s + kOperandTileTokens - 1) / kOperandTileTokens;
  for (int64_t bh = blockIdx.y; bh < a.nbh; bh += gridDim.y) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      // Raw 16-bit inputs are kept (8 registers per 16 values); the (smoothed) floats are
      // recomputed, identically, for the codes.
      uint4 r[kPerThread][2];
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          const uint4* src =
              reinterpret_cast<const uint4*>(row_chunk<kD, kNvfp4Block>(a, bh, token, blk));
          r[k][0] = __ldg(src);
          r[k][1] = __ldg(src + 1);
        }
      }
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          if (mean == nullptr) {
            m = max(m, raw_amax_bits_of<kF16, kNvfp4Block>(r[k]));
          } else {
            float v[kNvfp4Block];
            unpack_plain<kF16, kNvfp4Block>(r[k], mean + bh * kD + blk * kNvfp4Block, v);
            m = max(m, float_bits(block_amax(v, kNvfp4Block)));
          }
        }
      }
      const float amax = bits_float(block_max(m, smem));
      const bool finite = detail::is_finite(amax);
      float sc = 1.f, inv = 0.f;
      if (!finite) {
        sc = bits_float(detail::kQuietNan);
      } else if (amax != 0.f) {
        sc = detail::div_rn(amax, kE4m3Max);
        inv = detail::div_rn(kE4m3Max, amax);
        if (!detail::is_finite(inv)) inv = bits_float(detail::kFltMaxBits);
      }
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int chunk = threadIdx.x + k * kThreads;
        const int64_t token = tile * kOperandTileTokens + chunk / kNb;
        const int blk = chunk % kNb;
        if (token < a.s) {
          float v[kNvfp4Block];
          unpack_plain<kF16, kNvfp4Block>(r[k], mean ? mean + bh * kD + blk * kNvfp4Block : nullptr,
                                          v);
          // Finite tile: every product is finite, and e4m3x4_finite == float_to_e4m3 on every
          // finite float (swept on the host over all of them).
          uint32_t o[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint32_t wq = operand_fast::e4m3x4_finite(
                __fmul_rn(v[4 * q], inv), __fmul_rn(v[4 * q + 1], inv),
                __fmul_rn(v[4 * q + 2], inv), __fmul_rn(v[4 * q + 3], inv));
            o[q] = !finite ? 0x7F7F7F7Fu : amax == 0.f ? 0u : wq;
          }
          *reinterpret_cast<uint4*>(data + (bh * a.s + token) * kD + blk * kNvfp4Block) =
              make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
      if (threadIdx.x == 0) scale[bh * tiles + tile] = sc;
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("quantize_operand_cuda (Q/K): ") + what +
                         " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

dim3 slice_grid(int64_t blocks_per_slice, int64_t nbh) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(blocks_per_slice, 1, kMaxGridX)),
              static_cast<unsigned>(std::min<int64_t>(nbh, kMaxGridY)));
}

struct Launch {
  XArgs a;
  const float* mean;  // smoothed K: the mean written by pass 1; else null
  cudaStream_t stream;
};

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
      return 132;
    }
    return n;
  }();
  return sms;
}

// Host twin of packed::nvfp4_table_finite (the same single FP32 product) with s_enc > 0.
bool nvfp4_static_fast(float s_enc) { return s_enc > 0.f && s_enc * 512.f <= 3.4028234e38f; }

// Pass 3 for the NVFP4 rules: nvfp4_slice_setup_kernel (one table for a static s_enc, one per
// slice for computed ones), nvfp4_operand_kernel, and nvfp4_operand_generic_kernel where a slice
// may lack a finite table. slice_max: the slice amaxes when tensor_scale is 0.
template <bool kF16, int kD, Nvfp4ScaleRule kRule>
Status launch_nvfp4_operand(const Launch& l, const uint32_t* slice_max, float tensor_scale,
                            void* data, float* scale) {
  const XArgs& a = l.a;
  const bool computed = tensor_scale == 0.f;
  const int64_t n = computed ? a.nbh : 1;
  const int64_t step = computed ? 1 : 0;
  void* scratch = nullptr;
  const size_t table_offset = static_cast<size_t>(n) * sizeof(Nvfp4Slice);
  FP4ATTN_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&scratch, table_offset + n * 128 * sizeof(float2), l.stream),
                  "cudaMallocAsync"));
  Nvfp4Slice* slices = static_cast<Nvfp4Slice*>(scratch);
  float2* tables = reinterpret_cast<float2*>(static_cast<char*>(scratch) + table_offset);
  nvfp4_slice_setup_kernel<kRule>
      <<<static_cast<unsigned>(n), 128, 0, l.stream>>>(slice_max, tensor_scale, slices, tables);
  Status st = cuda_status(cudaGetLastError(), "nvfp4_slice_setup_kernel launch");
  const int64_t units = a.s * (kD / kNvfp4Block);
  if (st.ok() && (computed || nvfp4_static_fast(tensor_scale))) {
    // Blocks per thread: up to 8 where the grid still gives every SM many CTAs (the setup per
    // CTA and slice is then paid once per 8 blocks, and each step's loads overlap the previous
    // step's math); 1 for small inputs.
    const int64_t threads_needed = a.nbh * ((units + kThreads - 1) / kThreads) * kThreads;
    const int64_t enough = int64_t{sm_count()} * 4 * 4 * kThreads;  // SMs x CTAs x waves x threads
    const int64_t per = std::clamp<int64_t>(threads_needed / enough, 1, 8);
    const dim3 grid = slice_grid((units + kThreads * per - 1) / (kThreads * per), a.nbh);
    auto launch = [&](auto kernel, const float* mean) {
      kernel<<<grid, kThreads, 0, l.stream>>>(a, mean, slices, tables, step, data, scale);
    };
    if (l.mean != nullptr) {
      launch(nvfp4_operand_kernel<kF16, kD, kRule, true>, l.mean);
    } else {
      launch(nvfp4_operand_kernel<kF16, kD, kRule, false>, nullptr);
    }
    st = cuda_status(cudaGetLastError(), "nvfp4_operand_kernel launch");
  }
  if (st.ok() && (computed || !nvfp4_static_fast(tensor_scale))) {
    // Few CTAs: with a computed s_enc almost every slice has a table and returns at once.
    const int64_t gx = computed ? std::min<int64_t>((units + kThreads - 1) / kThreads, 4)
                                : (units + kThreads - 1) / kThreads;
    nvfp4_operand_generic_kernel<kF16, kD, kRule>
        <<<slice_grid(gx, a.nbh), kThreads, 0, l.stream>>>(a, l.mean, slices, step, data, scale);
    st = cuda_status(cudaGetLastError(), "nvfp4_operand_generic_kernel launch");
  }
  const Status free_st = cuda_status(cudaFreeAsync(scratch, l.stream), "cudaFreeAsync");
  return st.ok() ? free_st : st;
}

// Passes 2 and 3 for one (dtype, head_dim).
template <bool kF16, int kD>
Status run_passes(const Launch& l, Recipe recipe, float tensor_scale, void* data, float* scale) {
  const XArgs& a = l.a;
  if (recipe == Recipe::kFp8) {
    fp8_tile_kernel<kF16, kD>
        <<<slice_grid(operand_scale_tiles(a.s), a.nbh), kThreads, 0, l.stream>>>(
            a, l.mean, static_cast<uint8_t*>(data), scale);
    return cuda_status(cudaGetLastError(), "fp8_tile_kernel launch");
  }
  if (recipe == Recipe::kBf16) {
    const int64_t units = a.s * (kD / kNvfp4Block);
    quantize_kernel<kF16, kD, Mode::kBf16, Nvfp4ScaleRule::kNearest>
        <<<slice_grid((units + kThreads - 1) / kThreads, a.nbh), kThreads, 0, l.stream>>>(
            a, l.mean, nullptr, 0.f, data, scale);
    return cuda_status(cudaGetLastError(), "quantize_kernel launch");
  }
  const bool mx = recipe == Recipe::kMxfp4;
  const bool need_max = mx || tensor_scale == 0.f;
  const int blk = mx ? kMxfp4Block : kNvfp4Block;
  const int64_t units = a.s * (kD / blk);
  const dim3 grid = slice_grid((units + kThreads - 1) / kThreads, a.nbh);
  uint32_t* slice_max = nullptr;
  if (need_max) {
    const size_t bytes = static_cast<size_t>(a.nbh) * sizeof(uint32_t);
    FP4ATTN_RETURN_IF_ERROR(cuda_status(
        cudaMallocAsync(reinterpret_cast<void**>(&slice_max), bytes, l.stream), "cudaMallocAsync"));
    Status st = cuda_status(cudaMemsetAsync(slice_max, 0, bytes, l.stream), "cudaMemsetAsync");
    if (st.ok()) {
      if (mx) {
        slice_max_kernel<kF16, kD, true><<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max);
      } else {
        slice_max_kernel<kF16, kD, false><<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max);
      }
      st = cuda_status(cudaGetLastError(), "slice_max_kernel launch");
    }
    if (!st.ok()) {
      cudaFreeAsync(slice_max, l.stream);
      return st;
    }
  }
  fold_table_kernel<<<1, 512, 0, l.stream>>>();
  Status st = Status::Ok();
  switch (recipe) {
    case Recipe::kMxfp4:
      // One kernel: the split MX kernels would take more registers (occupancy) when smoothed.
      quantize_kernel<kF16, kD, Mode::kMx, Nvfp4ScaleRule::kNearest>
          <<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max, tensor_scale, data, scale);
      st = cuda_status(cudaGetLastError(), "quantize_kernel launch");
      break;
    case Recipe::kNvfp4Hx:
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kRestricted>(l, slice_max, tensor_scale,
                                                                       data, scale);
      break;
    case Recipe::kFp4Direct:
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kNearest>(l, slice_max, tensor_scale,
                                                                    data, scale);
      break;
    default:  // nvfp4, nvfp4-fast, nvfp4-all: Four-Over-Six
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kFourOverSix>(l, slice_max, tensor_scale,
                                                                        data, scale);
      break;
  }
  if (slice_max != nullptr) {
    const Status free_st = cuda_status(cudaFreeAsync(slice_max, l.stream), "cudaFreeAsync");
    if (st.ok()) st = free_st;
  }
  return st;
}

}  // namespace

Status quantize_qk_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                                const TensorView& data, const TensorView& scale,
                                const TensorView& mean, cudaStream_t stream) {
  // The kernels store data in 16-byte vectors and scale / mean as FP32 words.
  if (data.numel() > 0) FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(data.data, "data", 16));
  if (scale.numel() > 0) FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(scale.data, "scale", 4));
  if (opt.smooth_k && mean.numel() > 0) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(mean.data, "mean", 4));
  }
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  if (b == 0 || h == 0) return Status::Ok();
  const bool f16 = x.dtype == DType::kF16;
  Launch l{
      {static_cast<const uint16_t*>(x.data), x.stride[0], x.stride[1], x.stride[2], s, h, b * h},
      nullptr,
      stream};
  if (opt.smooth_k) {
    float* m = mean.as<float>();
    const int64_t n = b * h * d;
    const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
    const bool vec =
        (d == 64 || d == 128) && b * h * ((s + kMeanSegVec - 1) / kMeanSegVec) <= kMaxGridX;
    const int64_t seg_len = vec ? kMeanSegVec : kMeanSeg;
    const int nseg = static_cast<int>(std::max<int64_t>((s + seg_len - 1) / seg_len, 1));
    if (kParallelMean && s > 0) {
      MeanPartial* part = nullptr;
      const size_t bytes = static_cast<size_t>(n) * nseg * sizeof(MeanPartial);
      FP4ATTN_RETURN_IF_ERROR(cuda_status(
          cudaMallocAsync(reinterpret_cast<void**>(&part), bytes, stream), "cudaMallocAsync"));
      const unsigned pblocks = static_cast<unsigned>((n * nseg + kThreads - 1) / kThreads);
      const int di = static_cast<int>(d);
      const unsigned vblocks = static_cast<unsigned>(l.a.nbh * nseg);  // one CTA per segment
      if (f16) {
        if (d == 128) {
          mean_partial_vec_kernel<true, 128><<<vblocks, kThreads, 0, stream>>>(l.a, nseg, part);
        } else if (d == 64) {
          mean_partial_vec_kernel<true, 64><<<vblocks, kThreads, 0, stream>>>(l.a, nseg, part);
        } else {
          mean_partial_kernel<true><<<pblocks, kThreads, 0, stream>>>(l.a, di, nseg, part);
        }
        mean_finish_kernel<true><<<blocks, kThreads, 0, stream>>>(l.a, di, nseg, part, m);
      } else {
        if (d == 128) {
          mean_partial_vec_kernel<false, 128><<<vblocks, kThreads, 0, stream>>>(l.a, nseg, part);
        } else if (d == 64) {
          mean_partial_vec_kernel<false, 64><<<vblocks, kThreads, 0, stream>>>(l.a, nseg, part);
        } else {
          mean_partial_kernel<false><<<pblocks, kThreads, 0, stream>>>(l.a, di, nseg, part);
        }
        mean_finish_kernel<false><<<blocks, kThreads, 0, stream>>>(l.a, di, nseg, part, m);
      }
      Status st = cuda_status(cudaGetLastError(), "mean kernels launch");
      const Status free_st = cuda_status(cudaFreeAsync(part, stream), "cudaFreeAsync");
      FP4ATTN_RETURN_IF_ERROR(st);
      FP4ATTN_RETURN_IF_ERROR(free_st);
    } else if (f16) {
      mean_kernel<true><<<blocks, kThreads, 0, stream>>>(l.a, static_cast<int>(d), m);
    } else {
      mean_kernel<false><<<blocks, kThreads, 0, stream>>>(l.a, static_cast<int>(d), m);
    }
    FP4ATTN_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "mean_kernel launch"));
    l.mean = m;
  }
  if (s == 0) return Status::Ok();
  float* sc = scale.as<float>();
  if (d == 64) {
    return f16 ? run_passes<true, 64>(l, recipe, opt.tensor_scale, data.data, sc)
               : run_passes<false, 64>(l, recipe, opt.tensor_scale, data.data, sc);
  }
  return f16 ? run_passes<true, 128>(l, recipe, opt.tensor_scale, data.data, sc)
             : run_passes<false, 128>(l, recipe, opt.tensor_scale, data.data, sc);
}

}  // namespace fp4attn::detail
