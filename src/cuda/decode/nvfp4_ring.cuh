// The NVFP4 shared-memory ring of the paged decode: each warp streams its tiles through
// kRingStages shared-memory stages with cp.async, kRingStages - 1 tiles in flight while it
// computes one, five copies per lane and tile instead of the register path's twelve loads, and the
// raw tile lives in registers only while it is computed. A register double buffer holds one tile
// in flight: NVFP4 read at ~54% of the read ceiling that way, latency-bound at 16 warps x 2.3 KB
// per SM. Stage layout (RingLayout, decode_bits.h): K data, V data [16 keys][pitch] (pitch
// d/2 + 16 bytes: the V reads of keys 2t, 2t + 2, ... fall on distinct banks), K scales, V scales
// [16 keys][d/16].
#pragma once

#include <cstdint>

#include "cuda/decode/config.h"
#include "cuda/decode/decode_bits.h"
#include "cuda/decode/paging.cuh"
#include "cuda/decode/params.h"
#include "cuda/decode/tile_loads.cuh"
#include "cuda/sm90/cp_async.cuh"

namespace fp4attn::paged {

// One lane's share of a tile's copies: K and V data of keys g and g + 8, chunk t (d/8 bytes, the
// chunk the lane also reads for K); lanes 0-15 the K scale row of key lane, 16-31 the V one.
// What does not depend on the tile is computed once (RingLane): in-page offsets (32-bit, as
// load_tile's) and the shared-memory offsets inside a stage.
struct RingLane {
  uint32_t kd, vd, sc;  // in-page byte offsets of key g's chunks (data) and key sk's row (scales)
  uint32_t kd8, vd8;    // the same for key g + 8
  uint32_t skd, svd, ssc;  // offsets inside a stage
  const uint8_t* sc_base;  // the lane's scale array (K or V), its page and token strides
  int64_t sc_s0;
  int32_t sc_s1;
};

template <int D>
__device__ __forceinline__ RingLane ring_lane(const DecodeParams& p, int hk, int lane) {
  constexpr int kChunk = D / 8;
  const int g = lane >> 2, t = lane & 3, sk = lane & 15;
  const DecodeSide& sd = lane >= 16 ? p.v : p.k;
  RingLane l;
  const int32_t ks1 = static_cast<int32_t>(p.k.data_s[1]),
                vs1 = static_cast<int32_t>(p.v.data_s[1]);
  l.kd = static_cast<uint32_t>(g * ks1 + static_cast<int32_t>(hk * p.k.data_s[2]) + t * kChunk);
  l.vd = static_cast<uint32_t>(g * vs1 + static_cast<int32_t>(hk * p.v.data_s[2]) + t * kChunk);
  l.kd8 = l.kd + static_cast<uint32_t>(8 * ks1);
  l.vd8 = l.vd + static_cast<uint32_t>(8 * vs1);
  l.sc_s1 = static_cast<int32_t>(sd.scales_s[1]);
  l.sc = static_cast<uint32_t>(sk * l.sc_s1 + static_cast<int32_t>(hk * sd.scales_s[2]));
  l.sc_base = sd.scales;
  l.sc_s0 = sd.scales_s[0];
  l.skd = ring_data_dst<D>(false, g, t, 0);
  l.svd = ring_data_dst<D>(true, g, t, 0);
  l.ssc = ring_scale_dst<D>(lane);
  return l;
}

// Keys >= kend and bad pages are zero-filled (bad pages also set *bad), as load_tile's zeros.
template <int D>
__device__ __forceinline__ void ring_issue(const DecodeParams& p, int b, int kt, int kend,
                                           int32_t page, int lane, const RingLane& rl, uint32_t dst,
                                           bool* bad) {
  constexpr int kChunk = D / 8, kSc = D / 16;
  const int g = lane >> 2, sk = lane & 15;
  // A scale row (kSc bytes): cp.async when the scale views allow kSc-byte copies, else byte loads
  // and shared stores (rare layouts; synchronous).
  auto copy_scales = [&](const uint8_t* src, bool valid) {
    if (p.scales_vec) {
      sm90::cp_async_zfill<kSc>(dst + rl.ssc, valid ? src : p.k.data, valid);
    } else {
      // A loop kept as one (not unrolled), so that ptxas branches around it instead of issuing
      // its 2 x kSc instructions predicated off on every tile.
#pragma unroll 1
      for (int i = 0; i < kSc; ++i) {
        const uint32_t x = valid ? __ldg(src + i) : 0u;
        asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(dst + rl.ssc + i), "r"(x) : "memory");
      }
    }
  };
  if (p.pages16) {
    const bool ok = page >= 0 && page < p.num_pages;
    if (!ok) *bad = true;  // kt < kend: the tile's first key is real
    // The tile's row in each array: page * page stride (a 32 x 32 -> 64-bit multiply-add: the
    // host checks page strides < 2^32) + its first token * token stride.
    const uint32_t pg = ok ? static_cast<uint32_t>(page) : 0u;
    const uint32_t tok0 = static_cast<uint32_t>(kt - page_index(p, kt) * p.page_size);
    const uint8_t* kd = p.k.data + static_cast<uint64_t>(pg) * static_cast<uint32_t>(p.k.data_s[0]);
    const uint8_t* vd = p.v.data + static_cast<uint64_t>(pg) * static_cast<uint32_t>(p.v.data_s[0]);
    const uint8_t* sc = rl.sc_base + static_cast<uint64_t>(pg) * static_cast<uint32_t>(rl.sc_s0);
    // Opaque bases: see load_tile (the 64-bit products stay out of the per-copy addresses).
    asm volatile("" : "+l"(kd), "+l"(vd), "+l"(sc));
    const uint32_t tk = tok0 * static_cast<uint32_t>(p.k.data_s[1]);
    const uint32_t tv = tok0 * static_cast<uint32_t>(p.v.data_s[1]);
    const uint32_t ts = tok0 * static_cast<uint32_t>(rl.sc_s1);
    if (ok && kt + kDecodeTile <= kend) {
      // A full tile: every copy real, nothing tested.
      sm90::cp_async_zfill<kChunk>(dst + rl.skd, kd + (tk + rl.kd), true);
      sm90::cp_async_zfill<kChunk>(
          dst + rl.skd + (ring_data_dst<D>(false, 0, 0, 1) - ring_data_dst<D>(false, 0, 0, 0)),
          kd + (tk + rl.kd8), true);
      sm90::cp_async_zfill<kChunk>(dst + rl.svd, vd + (tv + rl.vd), true);
      sm90::cp_async_zfill<kChunk>(
          dst + rl.svd + (ring_data_dst<D>(true, 0, 0, 1) - ring_data_dst<D>(true, 0, 0, 0)),
          vd + (tv + rl.vd8), true);
      copy_scales(sc + (ts + rl.sc), true);
      return;
    }
    const bool v0 = ok && kt + g < kend, v1 = ok && kt + g + 8 < kend;
    const bool vs = ok && kt + sk < kend;
    sm90::cp_async_zfill<kChunk>(dst + rl.skd, v0 ? kd + (tk + rl.kd) : p.k.data, v0);
    sm90::cp_async_zfill<kChunk>(
        dst + rl.skd + (ring_data_dst<D>(false, 0, 0, 1) - ring_data_dst<D>(false, 0, 0, 0)),
        v1 ? kd + (tk + rl.kd8) : p.k.data, v1);
    sm90::cp_async_zfill<kChunk>(dst + rl.svd, v0 ? vd + (tv + rl.vd) : p.k.data, v0);
    sm90::cp_async_zfill<kChunk>(
        dst + rl.svd + (ring_data_dst<D>(true, 0, 0, 1) - ring_data_dst<D>(true, 0, 0, 0)),
        v1 ? vd + (tv + rl.vd8) : p.k.data, v1);
    copy_scales(vs ? sc + (ts + rl.sc) : p.k.data, vs);
    return;
  }
  // Page size not a multiple of 16: every key looks its page up (the lane-constant offsets of
  // RingLane are those of token 0 of a page plus the key's row; here the token comes from l.tok).
  const int32_t ks1 = static_cast<int32_t>(p.k.data_s[1]),
                vs1 = static_cast<int32_t>(p.v.data_s[1]);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int kk = g + 8 * j;
    bool valid = kt + kk < kend;
    const uint8_t* kd = p.k.data;
    const uint8_t* vd = p.k.data;
    if (valid) {
      const KeyLoc l = locate_key(p, b, kt + kk);
      if (l.ok) {
        const PageBases pb = page_bases(p, l.page);
        // rl.kd holds g * stride: take it out, add the key's own token.
        kd = pb.kd + (static_cast<uint32_t>((l.tok - g) * ks1) + rl.kd);
        vd = pb.vd + (static_cast<uint32_t>((l.tok - g) * vs1) + rl.vd);
      } else {
        *bad = true;
        valid = false;
      }
    }
    sm90::cp_async_zfill<kChunk>(dst + ring_data_dst<D>(false, g, lane & 3, j), kd, valid);
    sm90::cp_async_zfill<kChunk>(dst + ring_data_dst<D>(true, g, lane & 3, j), vd, valid);
  }
  bool valid = kt + sk < kend;
  const uint8_t* sc = p.k.data;
  if (valid) {
    const KeyLoc l = locate_key(p, b, kt + sk);
    if (l.ok) {
      sc =
          rl.sc_base + l.page * rl.sc_s0 + (static_cast<uint32_t>((l.tok - sk) * rl.sc_s1) + rl.sc);
    } else {
      *bad = true;
      valid = false;
    }
  }
  copy_scales(sc, valid);
}

template <int N>
__device__ __forceinline__ void lds_words(uint32_t (&w)[N], const uint8_t* src) {
  if constexpr (N == 4) {
    const uint4 x = *reinterpret_cast<const uint4*>(src);
    w[0] = x.x;
    w[1] = x.y;
    w[2] = x.z;
    w[3] = x.w;
  } else if constexpr (N == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(src);
    w[0] = x.x;
    w[1] = x.y;
  } else {
    static_assert(N == 1);
    w[0] = *reinterpret_cast<const uint32_t*>(src);
  }
}

// The lane's raw tile from a stage: the bytes the register path loads from global memory.
template <int D>
__device__ __forceinline__ void ring_read(const uint8_t* st, int g, int t, RawTile<D, true>& r) {
#pragma unroll
  for (int j = 0; j < 2; ++j) lds_words(r.k[j], st + ring_k_src<D>(g, t, j));
#pragma unroll
  for (int j = 0; j < 4; ++j) lds_words(r.v[j], st + ring_v_src<D>(g, t, j));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    r.ks[j] = D == 128 ? uint32_t(*reinterpret_cast<const uint16_t*>(st + ring_ks_src<D>(g, t, j)))
                       : uint32_t(st[ring_ks_src<D>(g, t, j)]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) r.vs[j] = st[ring_vs_src<D>(g, t, j)];
}

}  // namespace fp4attn::paged
