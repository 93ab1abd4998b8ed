// Kernels of the GPU paged KV append (paged_kv_cuda.h). Work unit: one 16-value block of one
// (token, kv head) row, for K and V together (four 16-byte loads in flight per thread), one
// thread per unit, 128 threads per CTA: at d = 128 and 8 kv heads a CTA covers two tokens.
// Every block goes through the encoders of the packed quantizer (packed_blocks.cuh), so the bytes
// are those of nvfp4_quantize_block, i.e. of the host append; FP8 elements go through
// paged_kv_encode_fp8 itself.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/quantize/packed_blocks.cuh"
#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/numerics/paged_kv_codec.h"
#include "fp4attn/paged_kv.h"

namespace fp4attn::paged {

constexpr int kAppendThreads = 128;  // also the size of the per-CTA scale tables

// One side (K or V) of an append.
struct AppendSide {
  const uint8_t* x;         // token bytes (16-bit elements)
  int64_t x_token, x_head;  // strides in bytes
  uint8_t* data;            // cache data view (bytes)
  int64_t data_s[3];        // page, offset, head strides in bytes
  uint8_t* scales;          // NVFP4 only
  int64_t scales_s[3];
  float* global;  // device F32: s_enc (NVFP4) or the decode scale (FP8)
};

struct AppendParams {
  AppendSide side[2];  // K, V
  const void* slots;   // I32 or I64 (slots64) [num_tokens], read at full width
  bool slots64;
  int32_t* error_flag;         // optional: kPagedErrorSlotPastCache OR'd for a slot past the cache
  int64_t units;               // num_tokens * kv_heads * (head_dim / 16)
  packed::FastDiv div_blocks;  // unit -> (token, head) row
  packed::FastDiv div_heads;   // row -> token
  int32_t num_slots, page_size;
  bool vec_store;   // every data view allows 8-byte (NVFP4) / 16-byte (FP8) block stores
  uint32_t* calib;  // calibration scratch: K amax bits, V amax bits
};

struct UnitPos {
  int64_t token, head, block;
};

__device__ __forceinline__ UnitPos unit_pos(const AppendParams& p, int64_t u) {
  const int64_t row = static_cast<int64_t>(p.div_blocks.div(static_cast<uint64_t>(u)));
  const int64_t token = static_cast<int64_t>(p.div_heads.div(static_cast<uint64_t>(row)));
  return {token, row - token * static_cast<int64_t>(p.div_heads.d),
          u - row * static_cast<int64_t>(p.div_blocks.d)};
}

__device__ __forceinline__ int64_t slot_of(const AppendParams& p, int64_t token) {
  return p.slots64 ? static_cast<const int64_t*>(p.slots)[token]
                   : static_cast<const int32_t*>(p.slots)[token];
}

// A slot the kernels write: in [0, num_slots). Anything else is skipped, so that unchecked slot
// values can never address memory outside the cache.
__device__ __forceinline__ bool slot_written(const AppendParams& p, int64_t slot) {
  return slot >= 0 && slot < p.num_slots;
}

__device__ __forceinline__ void load_block(const AppendSide& s, const UnitPos& q, uint4& a,
                                           uint4& b) {
  const uint8_t* src = s.x + q.token * s.x_token + q.head * s.x_head + q.block * 32;
  a = packed::load16(src);
  b = packed::load16(src + 16);
}

// Max of the finite |x| of 8 16-bit elements into acc (two lanes): NaN and Inf lanes count 0.
template <typename T>
__device__ __forceinline__ uint32_t finite_max2(uint32_t acc, uint32_t w) {
  constexpr uint32_t kInf2 = std::is_same_v<T, __half> ? 0x7C007C00u : 0x7F807F80u;
  const uint32_t a = w & 0x7FFF7FFFu;
  return __vmaxu2(acc, a & __vcmpltu2(a, kInf2));
}

// Calibration pass: atomicMax of the FP32 bits of the finite amax of every written token, per
// side whose global is still 0. Exits at once when both globals are set (the usual case after
// the first append).
template <typename T>
__global__ void __launch_bounds__(kAppendThreads) calibrate_amax_kernel(const AppendParams p) {
  const bool need[2] = {*p.side[0].global == 0.f, *p.side[1].global == 0.f};
  if (!need[0] && !need[1]) return;
  uint32_t acc[2] = {0, 0};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kAppendThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kAppendThreads + threadIdx.x; u < p.units;
       u += stride) {
    const UnitPos q = unit_pos(p, u);
    if (!slot_written(p, slot_of(p, q.token))) continue;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (!need[s]) continue;
      uint4 a, b;
      load_block(p.side[s], q, a, b);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[s] = finite_max2<T>(acc[s], w[i]);
    }
  }
  // abs16_to_f32_bits is monotone, so the max of the converted bits is the converted max.
  const unsigned lane = threadIdx.x % 32;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const uint32_t bits = __reduce_max_sync(
        0xFFFFFFFFu, packed::Half16<T>::abs16_to_f32_bits(packed::fold_max2(acc[s])));
    if (lane == 0 && need[s] && bits != 0) atomicMax(p.calib + s, bits);
  }
}

// Sets a global that is still 0 from the amax (host: resolve_global); an amax of 0 (nothing
// written, or only zeros and non-finite values) leaves it 0. One thread.
template <bool kNvfp4>
__global__ void calibrate_finish_kernel(const AppendParams p, Nvfp4ScaleRule rule) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    float* g = p.side[s].global;
    if (*g != 0.f) continue;
    const float amax = bits_float(p.calib[s]);
    *g = kNvfp4 ? paged_kv_calibrate_nvfp4(amax, rule) : paged_kv_calibrate_fp8(amax);
  }
}

// Stores the n32 words of one block's data (8 or 16 bytes) as one vector or byte by byte.
template <int kWords>
__device__ __forceinline__ void store_block(uint8_t* dst, const uint32_t (&w)[kWords], bool vec) {
  if (vec) {
    if constexpr (kWords == 2) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4 * kWords; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

__device__ __forceinline__ int64_t cache_offset(const int64_t (&s)[3], int32_t page, int32_t offset,
                                                int64_t head) {
  return page * s[0] + offset * s[1] + head * s[2];
}

template <typename T, Nvfp4ScaleRule kRule>
__device__ __forceinline__ uint32_t nvfp4_encode(const uint4& a, const uint4& b, float s_enc,
                                                 bool fast, const float2* table, uint32_t (&w)[2]) {
  if (!fast) return packed::nvfp4_block_reference_raw<T, kRule>(a, b, s_enc, w);
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    return packed::nvfp4_block_vec_46<T>(a, b, s_enc, table, w);
  } else {
    return packed::nvfp4_block_vec<T, kRule>(a, b, s_enc, table, w);
  }
}

// The encode passes' loop: f(q, page, offset, v) for each of this thread's units (grid-stride)
// whose slot is written, v the unit's K block (v[0], v[1]) and V block (v[2], v[3]), all four
// loads issued before f runs.
template <typename F>
__device__ __forceinline__ void for_each_written_unit(const AppendParams& p, F&& f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kAppendThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kAppendThreads + threadIdx.x; u < p.units;
       u += stride) {
    const UnitPos q = unit_pos(p, u);
    const int64_t slot64 = slot_of(p, q.token);
    if (!slot_written(p, slot64)) {
      // Reported once per token (its first unit); a negative slot is padding, not an error.
      if (slot64 >= p.num_slots && p.error_flag != nullptr && q.head == 0 && q.block == 0) {
        atomicOr(p.error_flag, kPagedErrorSlotPastCache);
      }
      continue;
    }
    const int32_t slot = static_cast<int32_t>(slot64);
    const int32_t page = slot / p.page_size, offset = slot - page * p.page_size;
    uint4 v[4];
    load_block(p.side[0], q, v[0], v[1]);
    load_block(p.side[1], q, v[2], v[3]);
    f(q, page, offset, v);
  }
}

// NVFP4 encode pass. The globals are read after the calibration kernels (same stream), one still
// 0 as paged_kv_encode_global's provisional 1. When s_enc / scale can overflow (nvfp4_table_finite
// false: a huge s_enc), the side takes the reference block quantizer instead of the table path,
// as the packed quantizer does.
template <typename T, Nvfp4ScaleRule kRule>
__global__ void __launch_bounds__(kAppendThreads) nvfp4_append_kernel(const AppendParams p) {
  __shared__ float2 table[2][kAppendThreads];
  const float g[2] = {paged_kv_encode_global(*p.side[0].global),
                      paged_kv_encode_global(*p.side[1].global)};
  packed::nvfp4_fill_scale_table(g[0], table[0]);
  packed::nvfp4_fill_scale_table(g[1], table[1]);
  __syncthreads();
  const bool fast[2] = {packed::nvfp4_table_finite(g[0]), packed::nvfp4_table_finite(g[1])};
  for_each_written_unit(p, [&](const UnitPos& q, int32_t page, int32_t offset, const uint4(&v)[4]) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const AppendSide& side = p.side[s];
      uint32_t w[2];
      const uint32_t code =
          nvfp4_encode<T, kRule>(v[2 * s], v[2 * s + 1], g[s], fast[s], table[s], w);
      store_block(side.data + cache_offset(side.data_s, page, offset, q.head) + q.block * 8, w,
                  p.vec_store);
      side.scales[cache_offset(side.scales_s, page, offset, q.head) + q.block] =
          static_cast<uint8_t>(code);
    }
  });
}

// FP8 encode pass: code = paged_kv_encode_fp8(x, 1 / scale) per element, 16 bytes per block
// (scale: paged_kv_encode_global of the stored one).
template <typename T>
__global__ void __launch_bounds__(kAppendThreads) fp8_append_kernel(const AppendParams p) {
  const float inv[2] = {paged_kv_fp8_inverse(paged_kv_encode_global(*p.side[0].global)),
                        paged_kv_fp8_inverse(paged_kv_encode_global(*p.side[1].global))};
  for_each_written_unit(p, [&](const UnitPos& q, int32_t page, int32_t offset, const uint4(&v)[4]) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      float x[16];
      packed::unpack8<T>(v[2 * s], x);
      packed::unpack8<T>(v[2 * s + 1], x + 8);
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        w[i / 4] |= static_cast<uint32_t>(paged_kv_encode_fp8(x[i], inv[s])) << (8 * (i % 4));
      }
      const AppendSide& side = p.side[s];
      store_block(side.data + cache_offset(side.data_s, page, offset, q.head) + q.block * 16, w,
                  p.vec_store);
    }
  });
}

}  // namespace fp4attn::paged
