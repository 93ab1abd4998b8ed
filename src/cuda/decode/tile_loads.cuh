// A lane's operand loads into registers: Q's MMA fragments of a row block (load_q_frags), and the
// register path's raw K/V tiles (FP8): what a lane loads for one 16-key tile before dequantization
// (RawTile, also what the NVFP4 ring hands the tile compute), straight from the cache pages.
#pragma once

#include <cstdint>

#include "cuda/decode/config.h"
#include "cuda/decode/decode_bits.h"
#include "cuda/decode/paging.cuh"
#include "cuda/decode/params.h"

namespace fp4attn::paged {

// Q fragments of row block m0 (rows rows) straight from global memory, permuted from true channel
// order to the kernel's (phys_k_*); padding rows zero.
template <int D, bool kFp4, bool kT>
__device__ __forceinline__ void load_q_frags(const DecodeParams& p, int b, int64_t q_begin, int hk,
                                             int group, int m0, int rows, int g, int t,
                                             uint32_t (&qa)[D / 16][kQRegs<kT>]) {
  const uint16_t* qrow[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int m = m0 + g + 8 * rr, i = m / group, hq = hk * group + m % group;
    qrow[rr] = p.q + (p.s_q > 0 ? b * p.q_sb + i * p.q_si : (q_begin + i) * p.q_sb) + hq * p.q_sh;
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int reg = 0; reg < kQRegs<kT>; ++reg) {
      const int rr = kT ? 0 : (reg & 1);
      const int kk = kT ? qt_b_kidx(t, reg) : 2 * t + 8 * (reg >> 1);
      const int c0 = kFp4 ? phys_k_nvfp4<D>(ks, kk) : phys_k_fp8<D>(ks, kk);
      const int c1 = kFp4 ? phys_k_nvfp4<D>(ks, kk + 1) : phys_k_fp8<D>(ks, kk + 1);
      uint32_t x = 0;
      if (g + 8 * rr < rows) {
        x = uint32_t(__ldg(qrow[rr] + c0)) | uint32_t(__ldg(qrow[rr] + c1)) << 16;
      }
      qa[ks][reg] = x;
    }
  }
}

// What a lane loads for one 16-key tile, before dequantization.
template <int D, bool kFp4>
struct RawTile {
  // K: keys g and g + 8 of the tile, the lane's chunk (NVFP4 d/8 bytes, FP8 d/4 bytes).
  static constexpr int kKWords = kFp4 ? D / 32 : D / 16;
  // V: keys 2t, 2t + 1, 2t + 8, 2t + 9, the lane group's chunk (NVFP4 d/16 bytes, FP8 d/8).
  static constexpr int kVWords = kFp4 ? D / 64 : D / 32;
  uint32_t k[2][kKWords];
  uint32_t v[4][kVWords];
  // NVFP4 scale bytes, one per register as loaded: combining them at load time (shifts, ORs)
  // made the warp wait for the loads right there, which undid the prefetch (ncu: 60% of the
  // kernel's stalls were long-scoreboard waits on those shifts). The dequantization combines
  // them (k_scale_pair, v_scale_pairs).
  uint32_t ks[2];  // K: key slot j, its one (d = 64) or two (d = 128, low byte first) blocks
  uint32_t vs[4];  // V: one per key, keys in the order above
};

template <int N>
__device__ __forceinline__ void load_words(uint32_t (&w)[N], const uint8_t* src) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + i / 4);
      w[i] = x.x;
      w[i + 1] = x.y;
      w[i + 2] = x.z;
      w[i + 3] = x.w;
    }
  } else if constexpr (N == 2) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(src));
    w[0] = x.x;
    w[1] = x.y;
  } else {
    static_assert(N == 1);
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(src));
  }
}

template <int N>
__device__ __forceinline__ void zero_words(uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = 0;
}

template <int N>
__device__ __forceinline__ void zero_words_volatile(uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("mov.b32 %0, 0;" : "=r"(w[i]));
}

template <int D, bool kFp4>
__device__ __forceinline__ void zero_all_volatile(RawTile<D, kFp4>& r) {
#pragma unroll
  for (int j = 0; j < 2; ++j) zero_words_volatile(r.k[j]);
#pragma unroll
  for (int j = 0; j < 4; ++j) zero_words_volatile(r.v[j]);
  zero_words_volatile(r.ks);
  zero_words_volatile(r.vs);
}

// A lane's byte offsets inside a page that do not depend on the token: the kv head and the lane's
// chunk (K data / K scales / V data / V scales), 32-bit (decode.cu checks that every in-page
// offset fits). Recomputed per tile (4 IMADs) rather than held in registers across the loop.
struct LaneOffsets {
  int32_t kd, ks, vd, vs;
};

template <int D, bool kFp4>
__device__ __forceinline__ LaneOffsets lane_offsets(const DecodeParams& p, int hk, int g, int t) {
  LaneOffsets o;
  o.kd = static_cast<int32_t>(hk * p.k.data_s[2]) + t * (kFp4 ? D / 8 : D / 4);
  o.vd = static_cast<int32_t>(hk * p.v.data_s[2]) + g * (kFp4 ? D / 16 : D / 8);
  o.ks = static_cast<int32_t>(hk * p.k.scales_s[2]) + (D == 128 ? 2 * t : t);
  o.vs = static_cast<int32_t>(hk * p.v.scales_s[2]) + (D == 128 ? g : g / 2);
  return o;
}

// Key kk of the tile into K slot j (its data chunk and, NVFP4, its scale bytes).
template <int D, bool kFp4>
__device__ __forceinline__ void load_k_key(const DecodeParams& p, const PageBases& pb, int tok,
                                           const LaneOffsets& lo, int j, RawTile<D, kFp4>& r) {
  // In-page offsets are non-negative and below 2^31 (decode.cu): unsigned, so that adding them to
  // the 64-bit base needs no sign extension.
  load_words(r.k[j],
             pb.kd + static_cast<uint32_t>(tok * static_cast<int32_t>(p.k.data_s[1]) + lo.kd));
  if constexpr (kFp4) {
    const uint8_t* sc =
        pb.ks + static_cast<uint32_t>(tok * static_cast<int32_t>(p.k.scales_s[1]) + lo.ks);
    if constexpr (D == 128) {
      // Two bytes; the fallback's combine waits for its loads (rare layouts only).
      r.ks[j] = p.k_scales_u16 ? __ldg(reinterpret_cast<const uint16_t*>(sc))
                               : uint32_t(__ldg(sc)) | uint32_t(__ldg(sc + 1)) << 8;
    } else {
      r.ks[j] = __ldg(sc);
    }
  }
}

template <int D, bool kFp4>
__device__ __forceinline__ void load_v_key(const DecodeParams& p, const PageBases& pb, int tok,
                                           const LaneOffsets& lo, int j, RawTile<D, kFp4>& r) {
  load_words(r.v[j],
             pb.vd + static_cast<uint32_t>(tok * static_cast<int32_t>(p.v.data_s[1]) + lo.vd));
  if constexpr (kFp4) {
    r.vs[j] =
        __ldg(pb.vs + static_cast<uint32_t>(tok * static_cast<int32_t>(p.v.scales_s[1]) + lo.vs));
  }
}

// Loads tile kt (keys [kt, kt + 16), those >= kend read as zeros). Sets *bad on a page id out of
// range. When a tile lies in one page (page_size % 16 == 0, tiles start at multiples of 16), its
// page id `page` (tile_page, read earlier by the caller) and one 64-bit page base per array serve
// the tile, and each key adds a 32-bit in-page offset; otherwise every key looks its page up.
template <int D, bool kFp4>
__device__ __forceinline__ void load_tile(const DecodeParams& p, int b, int hk, int kt, int kend,
                                          int32_t page, int g, int t, RawTile<D, kFp4>& r,
                                          bool* bad) {
  // hk, g, t made opaque here so that the compiler recomputes the four offsets per tile (4 IMADs)
  // instead of holding them across the loop: at d = 128 those 4 registers made it spill.
  int hk_o = hk, g_o = g, t_o = t;
  asm volatile("" : "+r"(hk_o), "+r"(g_o), "+r"(t_o));
  const LaneOffsets lo = lane_offsets<D, kFp4>(p, hk_o, g_o, t_o);
  auto zero_all = [&] {
    if constexpr (kFp4) {
      r.ks[0] = r.ks[1] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) r.vs[j] = 0;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) zero_words(r.k[j]);
#pragma unroll
    for (int j = 0; j < 4; ++j) zero_words(r.v[j]);
  };
  if (p.pages16) {
    const KeyLoc l{page, kt - page_index(p, kt) * p.page_size, page >= 0 && page < p.num_pages};
    if (!l.ok) {  // kt < kend: the tile's first key is real
      // Zeros written by volatile asm: plain stores were hoisted above the branch and ran on every
      // tile (12 CS2R per tile in the SASS). The row is NaN anyway; the zeros only keep the
      // registers defined.
      zero_all_volatile(r);
      *bad = true;
      return;
    }
    PageBases pb = page_bases(p, l.page);
    // The four 64-bit page bases, formed once per tile: left visible, the compiler folded the
    // 64-bit page * stride product into every key's address (IMAD.WIDE + 2 IMAD + sign
    // extension + 2 IADD3 per address, ~130 instructions per tile in the SASS).
    asm volatile("" : "+l"(pb.kd), "+l"(pb.ks), "+l"(pb.vd), "+l"(pb.vs));
    if (kt + kDecodeTile <= kend) {
      // A full tile (all but the last of a range): every key loads, nothing to zero or test.
#pragma unroll
      for (int j = 0; j < 2; ++j) load_k_key<D, kFp4>(p, pb, l.tok + g + 8 * j, lo, j, r);
#pragma unroll
      for (int j = 0; j < 4; ++j) load_v_key<D, kFp4>(p, pb, l.tok + v_key(t, j), lo, j, r);
      return;
    }
    zero_all();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int kk = g + 8 * j;
      if (kt + kk < kend) load_k_key<D, kFp4>(p, pb, l.tok + kk, lo, j, r);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int kk = v_key(t, j);
      if (kt + kk < kend) load_v_key<D, kFp4>(p, pb, l.tok + kk, lo, j, r);
    }
    return;
  }
  zero_all();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int kk = g + 8 * j;
    if (kt + kk < kend) {
      const KeyLoc l = locate_key(p, b, kt + kk);
      if (l.ok) {
        load_k_key<D, kFp4>(p, page_bases(p, l.page), l.tok, lo, j, r);
      } else {
        *bad = true;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int kk = v_key(t, j);
    if (kt + kk < kend) {
      const KeyLoc l = locate_key(p, b, kt + kk);
      if (l.ok) {
        load_v_key<D, kFp4>(p, page_bases(p, l.page), l.tok, lo, j, r);
      } else {
        *bad = true;
      }
    }
  }
}

}  // namespace fp4attn::paged
