// The paged decode kernel (paged_attention_cuda.h; docs/kernels/decode.md section 7 has the
// design and the instruction budget). One CTA of 4 warps per (split, kv head, row block,
// sequence); a row block is up to 16 query rows (group heads x tokens) sharing one kv head, the M
// of mma.m16n8k16 (BF16 in, FP32 accumulate). Each warp takes every 4th 16-key tile of the CTA's
// key range, dequantizes K and V straight from global loads into MMA B fragments (no shared
// memory), keeps its own online softmax, and the warps merge through shared memory at the end.
//
// Fragment maps (lane = 4 g + t): the S = Q K^T MMA's k index is a permutation of the channels
// chosen so that lane t of key g reads one contiguous chunk of the key's packed row (phys_k_* in
// decode_bits.h),
// and Q is loaded with the same permutation; the P V MMA's n index is permuted so that lane group
// g owns channels [g d/8, (g + 1) d/8) (n-tile j <-> channel g d/8 + j), its 4 keys' chunks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/paged/decode_bits.h"

namespace fp4attn::paged {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeRows = 16;  // MMA M: query rows of a row block
constexpr int kDecodeTile = 16;  // keys per warp tile
// CTAs per SM the register allocation must allow (__launch_bounds__): d = 64: 4 (<= 128
// registers); d = 128: 2 (FP8: its raw tiles are twice as large, 3 would spill; NVFP4: 3 (<= 168
// registers) spilled in the loop once the scale bytes stayed apart, and measured 1.03 ms against
// 0.77 ms with 2 at b = 32, L = 32k).
// FP4ATTN_DECODE_NVFP4_D128_CTAS overrides the NVFP4 d = 128 figure (an experiment switch).
#ifndef FP4ATTN_DECODE_NVFP4_D128_CTAS
#define FP4ATTN_DECODE_NVFP4_D128_CTAS 2
#endif
// The transposed form (kT, <= 8 rows, 7.8) holds half the Q and O fragments (d/16 x 2 and d/16 x
// 4 registers instead of d/16 x 4 and d/8 x 4): NVFP4 d = 128 fits 4 CTAs (<= 128 registers, no
// spill, the next tile's loads still ahead of this tile's MMAs); FP8 d = 128 spilled ~106 bytes
// at 4 and takes 3 (<= 168).
#ifndef FP4ATTN_DECODE_T_NVFP4_D128_CTAS
#define FP4ATTN_DECODE_T_NVFP4_D128_CTAS 4
#endif
template <int D, bool kFp4, bool kT = false>
constexpr int kDecodeMinBlocks = kT ? (D == 64 ? 4 : (kFp4 ? FP4ATTN_DECODE_T_NVFP4_D128_CTAS : 3))
                                    : (D == 64 ? 4 : (kFp4 ? FP4ATTN_DECODE_NVFP4_D128_CTAS : 2));
// Query rows of a row block: the MMA's M (16) in the 16-row form, its N (8) in the transposed one.
template <bool kT>
constexpr int kBlockRows = kT ? 8 : kDecodeRows;

// One side (K or V) of the cache, byte strides (page, token, head).
struct DecodeSide {
  const uint8_t* data;
  int64_t data_s[3];
  const uint8_t* scales;  // NVFP4 only
  int64_t scales_s[3];
  const float* global;  // s_enc (NVFP4) or the decode scale (FP8), device memory
};

// The split combine's view of the partials and the outputs (combine_partials_kernel, and the
// decode kernel's fused combine).
struct CombineParams {
  const float* o_part;
  int64_t op_s[3];  // elements: split, row, head (last dim contiguous)
  const float* lse_part;
  int64_t lp_s[3];
  int32_t splits, h, d;
  int64_t total_q;
  int32_t s_q;  // > 0: output row r is (r / s_q, r % s_q) of a rank-4 o/lse; 0: rank 3 / 2
  uint16_t* o;  // BF16
  int64_t o_sb, o_si, o_sh;
  float* lse;  // optional
  int64_t l_sb, l_si, l_sh;
};

struct DecodeParams {
  const uint16_t* q;         // BF16 bits
  int64_t q_sb, q_si, q_sh;  // elements: rank 4 (batch, token, head); varlen (row, -, head)
  int32_t s_q;               // tokens per sequence (rank-4 q); 0: varlen through cu_seqlens_q
  const int32_t* cu_seqlens_q;
  int64_t total_q;
  DecodeSide k, v;
  const int32_t* block_tables;
  int64_t bt_s0, bt_s1;
  const int32_t* seq_lens;
  int32_t page_size, page_shift;  // page_shift: log2(page_size), or -1
  bool pages16;                   // page_size % 16 == 0: a 16-key tile is inside one page
  bool k_scales_u16;  // NVFP4, d = 128: K scale address and strides even (one 16-bit load)
  bool scales_vec;    // NVFP4: both scale views' addresses and strides multiples of d/16 bytes
                      // (a token's scale row is one cp.async)
  int32_t num_pages, max_pages;
  int32_t h, group;
  float scale_log2;  // softmax_scale * log2(e)
  bool causal;
  int32_t split_size, num_splits, row_blocks;
  // Final outputs (write_partials false): o BF16, lse F32 natural log (optional).
  uint16_t* o;
  int64_t o_sb, o_si, o_sh;
  float* lse;
  int64_t l_sb, l_si, l_sh;
  // Partials (write_partials true): contiguous F32 [splits, total_q, h, d] and [splits, total_q,
  // h].
  float* o_part;
  float* lse_part;
  bool write_partials;
  // Fused combine (write_partials and counters set): the last CTA of each (sequence, kv head,
  // row block) group to finish its split merges the group's partials (comb) into o / lse.
  // counters: one int per (row, head) item, indexed by the group's first item; zero before the
  // launch, and left zero by it (each group's last arriver resets its counter).
  int32_t* counters;
  CombineParams comb;
};

// ---- small device helpers
// ------------------------------------------------------------------------

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 8x8 16-bit matrix in the m8n8 fragment layout (lane (g, t): row g, columns 2t, 2t + 1) ->
// its transpose in the same layout (decode_bits.h, "P^T to the B operand").
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// a * {b.half, b.half}: the half broadcast is an operand selector of HMUL2 (.H0_H0 / .H1_H1), no
// extra instruction.
template <int kHalf>
__device__ __forceinline__ uint32_t bf16x2_mul_bcast(uint32_t a, uint32_t b) {
  uint32_t d;
  if constexpr (kHalf == 0) {
    asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {l, l};\n"
        " mul.rn.bf16x2 %0, %1, t;\n}"
        : "=r"(d)
        : "r"(a), "r"(b));
  } else {
    asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {h, h};\n"
        " mul.rn.bf16x2 %0, %1, t;\n}"
        : "=r"(d)
        : "r"(a), "r"(b));
  }
  return d;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Two E4M3 codes (low byte first) -> FP32, exact (NaN kept).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Two E4M3 block scales (low byte first) -> BF16x2 of scale * 2^118, exact: an E4M3 value has 4
// significant bits and 448 * 2^118 < 2^127. Times an E2M1 code read as e2m1 * 2^-126 (below), the
// product is e2m1 * scale * 2^-8 in [2^-18, 10.5], exact in BF16.
constexpr float kScaleBias = 3.3230699894622794e35f;  // 2^118
__device__ __forceinline__ uint32_t scale_pair_bf16(uint32_t two_codes) {
  const float2 f = e4m3x2_to_float2(two_codes);
  return pack_bf16x2(f.x * kScaleBias, f.y * kScaleBias);
}

// ---- raw tile loads --------------------------------------------------------------------------

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
  // kernel's stalls were long-scoreboard waits on those shifts). compute_tile combines them.
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

// Where key `key` of sequence b lives: (page, token in page); ok false for a page id outside
// [0, num_pages) (never read).
struct KeyLoc {
  int64_t page;
  int32_t tok;
  bool ok;
};

__device__ __forceinline__ int page_index(const DecodeParams& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}

__device__ __forceinline__ KeyLoc locate_key(const DecodeParams& p, int b, int key) {
  const int pi = page_index(p, key);
  const int32_t page = __ldg(p.block_tables + b * p.bt_s0 + pi * p.bt_s1);
  return {page, key - pi * p.page_size, page >= 0 && page < p.num_pages};
}

// The page id of a pages16 tile starting at key kt (the tile lies in one page), -1 when kt is
// past kend (nothing read). The main loop reads it one tile before the tile's data loads, so that
// a tile's prefetch waits for one memory latency instead of two (block table, then data): the
// NVFP4 kernel was latency-bound at 0.7 TB/s with the lookup in the chain (ncu, b=32, L=32k).
__device__ __forceinline__ int32_t tile_page(const DecodeParams& p, int b, int kt, int kend) {
  if (!p.pages16 || kt >= kend) return -1;
  return __ldg(p.block_tables + b * p.bt_s0 + page_index(p, kt) * p.bt_s1);
}
// The same from the sequence's block-table row (formed once per CTA: the ring's loop had
// recomputed b * bt_s0 in 64 bits on every tile).
__device__ __forceinline__ int32_t tile_page_row(const DecodeParams& p, const int32_t* bt_row,
                                                 int kt, int kend) {
  if (!p.pages16 || kt >= kend) return -1;
  return __ldg(bt_row + page_index(p, kt) * p.bt_s1);
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

// The four page bases of one page id.
struct PageBases {
  const uint8_t *kd, *ks, *vd, *vs;
};

__device__ __forceinline__ PageBases page_bases(const DecodeParams& p, int64_t page) {
  return {p.k.data + page * p.k.data_s[0], p.k.scales + page * p.k.scales_s[0],
          p.v.data + page * p.v.data_s[0], p.v.scales + page * p.v.scales_s[0]};
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
    // extension + 2 IADD3 per address, ~130 instructions per tile; SASS, decode.md 7.8).
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

// ---- the NVFP4 shared-memory ring (decode.md 7.10) ---------------------------------------------
// Each warp streams its tiles through kRingStages shared-memory stages with cp.async: kRingStages
// - 1 tiles in flight while it computes one (the register double buffer held one: NVFP4 read at
// ~54% of the read ceiling, latency-bound at 16 warps x 2.3 KB per SM), five copies per lane and
// tile instead of twelve loads, and the raw tile lives in registers only while it is computed.
// Stage layout: K data, V data [16 keys][pitch] (pitch d/2 + 16 bytes: the V reads of keys 2t,
// 2t + 2, ... fall on distinct banks), K scales, V scales [16 keys][d/16].
constexpr int kRingStages = 4;
template <int D>
struct Ring : RingLayout<D> {  // the stage layout and maps live in decode_bits.h (CPU-tested)
  static constexpr int kWarpBytes = kRingStages * RingLayout<D>::kStage;
};

// cp.async of kBytes, zero-filled (nothing read) when !valid; src must be a valid address anyway.
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(kBytes), "r"(n)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

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
      cp_async_zfill<kSc>(dst + rl.ssc, valid ? src : p.k.data, valid);
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
      cp_async_zfill<kChunk>(dst + rl.skd, kd + (tk + rl.kd), true);
      cp_async_zfill<kChunk>(
          dst + rl.skd + (ring_data_dst<D>(false, 0, 0, 1) - ring_data_dst<D>(false, 0, 0, 0)),
          kd + (tk + rl.kd8), true);
      cp_async_zfill<kChunk>(dst + rl.svd, vd + (tv + rl.vd), true);
      cp_async_zfill<kChunk>(
          dst + rl.svd + (ring_data_dst<D>(true, 0, 0, 1) - ring_data_dst<D>(true, 0, 0, 0)),
          vd + (tv + rl.vd8), true);
      copy_scales(sc + (ts + rl.sc), true);
      return;
    }
    const bool v0 = ok && kt + g < kend, v1 = ok && kt + g + 8 < kend;
    const bool vs = ok && kt + sk < kend;
    cp_async_zfill<kChunk>(dst + rl.skd, v0 ? kd + (tk + rl.kd) : p.k.data, v0);
    cp_async_zfill<kChunk>(
        dst + rl.skd + (ring_data_dst<D>(false, 0, 0, 1) - ring_data_dst<D>(false, 0, 0, 0)),
        v1 ? kd + (tk + rl.kd8) : p.k.data, v1);
    cp_async_zfill<kChunk>(dst + rl.svd, v0 ? vd + (tv + rl.vd) : p.k.data, v0);
    cp_async_zfill<kChunk>(
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
    cp_async_zfill<kChunk>(dst + ring_data_dst<D>(false, g, lane & 3, j), kd, valid);
    cp_async_zfill<kChunk>(dst + ring_data_dst<D>(true, g, lane & 3, j), vd, valid);
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

// ---- one tile: S = Q K^T, online softmax, O += P V -------------------------------------------

template <int D>
struct WarpState {
  float o[D / 8][4];
  float m[2], l[2];  // rows g, g + 8: running max (log2 units) and this lane's partial sum
};

template <int D, bool kFp4>
__device__ __forceinline__ void compute_tile(const RawTile<D, kFp4>& r,
                                             const uint32_t (&qa)[D / 16][4], int kt,
                                             const int (&vis)[2], float sl2, int t,
                                             WarpState<D>& st) {
  constexpr int kSteps = D / 16;
  float s[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
  }
  // S = Q K^T: per key half j (n-tile), k-steps from the lane's words.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if constexpr (kFp4) {
      // The key's block scales as one BF16x2 (d = 128: blocks 0, 1; d = 64: the one block twice);
      // word i takes its block's half by the HMUL2 operand selector.
      const uint32_t sc = scale_pair_bf16(D == 128 ? r.ks[j] : r.ks[j] * 0x101u);
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        // Word i: channels (d/4) t + 8 i .. + 8, scale block ((d/4) t + 8 i) / 16.
        uint32_t w[4];
        e2m1x8_to_bf16(r.k[j][i], w);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          w[q] = (D == 128 && (i >> 1)) ? bf16x2_mul_bcast<1>(w[q], sc)
                                        : bf16x2_mul_bcast<0>(w[q], sc);
        }
        mma_bf16_16816(s[j], qa[2 * i], w[0], w[1]);
        mma_bf16_16816(s[j], qa[2 * i + 1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const uint32_t x = r.k[j][ks];
        const float2 a = e4m3x2_to_float2(x & 0xFFFFu), b = e4m3x2_to_float2(x >> 16);
        mma_bf16_16816(s[j], qa[ks], pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y));
      }
    }
  }
  // Scale, mask, online softmax (base 2). Element e of n-tile j: row g + 8 (e >> 1), key
  // kt + 8 j + 2 t + (e & 1).
  float corr[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kt + 8 * j + 2 * t + c;
        float& x = s[j][2 * rr + c];
        x = key < vis[rr] ? x * sl2 : -INFINITY;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
    const float m_new = fmaxf(st.m[rr], mx);
    const float ref = m_new == -INFINITY ? 0.f : m_new;
    // 1 when the max did not move, also for rows that see no key yet (-inf == -inf): the padding
    // rows of a block (12 of 16 at one token and 32/8) otherwise gave 0 and forced the O rescale
    // below on every tile (64 FMUL per tile, ~11% of the NVFP4 kernel's instructions in ncu).
    corr[rr] = st.m[rr] == m_new ? 1.f : fast_exp2(st.m[rr] - ref);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[j][2 * rr + c];
        x = fast_exp2(x - ref);
        sum += x;
      }
    }
    st.l[rr] = st.l[rr] * corr[rr] + sum;
    st.m[rr] = m_new;
  }
  if (__any_sync(0xFFFFFFFFu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      st.o[n][0] *= corr[0];
      st.o[n][1] *= corr[0];
      st.o[n][2] *= corr[1];
      st.o[n][3] *= corr[1];
    }
  }
  const uint32_t pa[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]),
                          pack_bf16x2(s[1][0], s[1][1]), pack_bf16x2(s[1][2], s[1][3])};
  // O += P V: keys (2t, 2t+1) -> b0, (2t+8, 2t+9) -> b1; n-tile j = the lane group's channel j.
  if constexpr (kFp4) {
    const uint32_t sc0 = scale_pair_bf16(r.vs[0] | r.vs[1] << 8);
    const uint32_t sc1 = scale_pair_bf16(r.vs[2] | r.vs[3] << 8);
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Bytes {A.b(2h), A.b(2h+1), B.b(2h), B.b(2h+1)}: nibble q = A channel q, q + 4 = B.
        uint32_t w0[4], w1[4];
        e2m1x8_to_bf16(nvfp4_key_pair(r.v[0][i], r.v[1][i], half), w0);
        e2m1x8_to_bf16(nvfp4_key_pair(r.v[2][i], r.v[3][i], half), w1);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          mma_bf16_16816(st.o[8 * i + 4 * half + q], pa, bf16x2_mul(w0[q], sc0),
                         bf16x2_mul(w1[q], sc1));
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t sh = 16 * half;
        const float2 a = e4m3x2_to_float2(r.v[0][i] >> sh), b = e4m3x2_to_float2(r.v[1][i] >> sh);
        const float2 c = e4m3x2_to_float2(r.v[2][i] >> sh), d = e4m3x2_to_float2(r.v[3][i] >> sh);
        mma_bf16_16816(st.o[4 * i + 2 * half], pa, pack_bf16x2(a.x, b.x), pack_bf16x2(c.x, d.x));
        mma_bf16_16816(st.o[4 * i + 2 * half + 1], pa, pack_bf16x2(a.y, b.y),
                       pack_bf16x2(c.y, d.y));
      }
    }
  }
}

// ---- one tile, transposed form (<= 8 rows): S^T = K Q^T, online softmax, O^T += V^T P^T ---------

template <int D>
struct WarpStateT {
  float o[D / 16][4];  // M-tile i, element e: channel phys_ot(i, g + 8 (e >> 1)), row 2t + (e & 1)
  float m[2], l[2];    // rows 2t, 2t + 1: running max (log2 units), this lane's partial sum
};

template <int D, bool kFp4>
__device__ __forceinline__ void compute_tile_t(const RawTile<D, kFp4>& r,
                                               const uint32_t (&qb)[D / 16][2], int kt,
                                               const int (&vis)[2], float sl2, int g,
                                               WarpStateT<D>& st) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  // S^T: one MMA per k-step for both key slots (A rows g and g + 8), B = the lane's Q row g.
  if constexpr (kFp4) {
    // Key slot j's scales: d = 128: its two blocks (low byte first) as one BF16x2, each word then
    // takes its block's half by the HMUL2 operand selector (one conversion per key, not two).
    uint32_t ksc[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) ksc[j] = scale_pair_bf16(D == 128 ? r.ks[j] : r.ks[j] * 0x101u);
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      uint32_t w[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        e2m1x8_to_bf16(r.k[j][i], w[j]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          // Word i: block i / 2 (d = 128) or 0.
          w[j][q] = (D == 128 && (i >> 1)) ? bf16x2_mul_bcast<1>(w[j][q], ksc[j])
                                           : bf16x2_mul_bcast<0>(w[j][q], ksc[j]);
        }
      }
      uint32_t a[4];
      kt_a_frag(w[0][0], w[0][1], w[1][0], w[1][1], a);
      mma_bf16_16816(s, a, qb[2 * i][0], qb[2 * i][1]);
      kt_a_frag(w[0][2], w[0][3], w[1][2], w[1][3], a);
      mma_bf16_16816(s, a, qb[2 * i + 1][0], qb[2 * i + 1][1]);
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t lo[2], hi[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t x = r.k[j][ks];
        const float2 a = e4m3x2_to_float2(x & 0xFFFFu), b = e4m3x2_to_float2(x >> 16);
        lo[j] = pack_bf16x2(a.x, a.y);
        hi[j] = pack_bf16x2(b.x, b.y);
      }
      uint32_t a[4];
      kt_a_frag(lo[0], hi[0], lo[1], hi[1], a);
      mma_bf16_16816(s, a, qb[ks][0], qb[ks][1]);
    }
  }
  // Scale, mask, online softmax (base 2). Element e: key kt + g + 8 (e >> 1), row 2t + (e & 1);
  // a row's 16 keys live in the 8 lanes of one t (xor 4, 8, 16).
  float corr[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = kt + g + 8 * h;
      float& x = s[2 * h + rr];
      x = key < vis[rr] ? x * sl2 : -INFINITY;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 16));
    const float m_new = fmaxf(st.m[rr], mx);
    const float ref = m_new == -INFINITY ? 0.f : m_new;
    corr[rr] = st.m[rr] == m_new ? 1.f : fast_exp2(st.m[rr] - ref);
    float sum = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& x = s[2 * h + rr];
      x = fast_exp2(x - ref);
      sum += x;
    }
    st.l[rr] = st.l[rr] * corr[rr] + sum;
    st.m[rr] = m_new;
  }
  if (__any_sync(0xFFFFFFFFu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[i][e] *= corr[e & 1];
    }
  }
  // P^T as the B operand: keys 0..7 and 8..15 as two 8x8 BF16 matrices, transposed in registers.
  const uint32_t pb0 = movmatrix_trans(pack_bf16x2(s[0], s[1]));
  const uint32_t pb1 = movmatrix_trans(pack_bf16x2(s[2], s[3]));
  // O^T += V^T P^T: M-tile i = the 16-row form's n-tiles 2i, 2i + 1 (same dequantization).
  if constexpr (kFp4) {
    const uint32_t sc0 = scale_pair_bf16(r.vs[0] | r.vs[1] << 8);
    const uint32_t sc1 = scale_pair_bf16(r.vs[2] | r.vs[3] << 8);
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t w0[4], w1[4];
        e2m1x8_to_bf16(nvfp4_key_pair(r.v[0][i], r.v[1][i], half), w0);
        e2m1x8_to_bf16(nvfp4_key_pair(r.v[2][i], r.v[3][i], half), w1);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          // n-tiles 8i + 4 half + 2u + {0, 1}: M-tile 4i + 2 half + u.
          uint32_t a[4];
          vt_a_frag(bf16x2_mul(w0[2 * u], sc0), bf16x2_mul(w1[2 * u], sc1),
                    bf16x2_mul(w0[2 * u + 1], sc0), bf16x2_mul(w1[2 * u + 1], sc1), a);
          mma_bf16_16816(st.o[4 * i + 2 * half + u], a, pb0, pb1);
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t sh = 16 * half;
        const float2 a = e4m3x2_to_float2(r.v[0][i] >> sh), b = e4m3x2_to_float2(r.v[1][i] >> sh);
        const float2 c = e4m3x2_to_float2(r.v[2][i] >> sh), d = e4m3x2_to_float2(r.v[3][i] >> sh);
        // n-tiles 4i + 2 half (.x) and + 1 (.y): M-tile 2i + half.
        uint32_t af[4];
        vt_a_frag(pack_bf16x2(a.x, b.x), pack_bf16x2(c.x, d.x), pack_bf16x2(a.y, b.y),
                  pack_bf16x2(c.y, d.y), af);
        mma_bf16_16816(st.o[2 * i + half], af, pb0, pb1);
      }
    }
  }
}

// ---- the kernel ---------------------------------------------------------------------------------

// Shared memory of the warp merge: per warp 16 rows of O, row stride d + 8 floats, element
// (row, n-tile, column) at row * (d + 8) + 8 n + column (channel (d/8) column + n): the stores of
// the accumulators and the loads of the merge are (nearly) free of bank conflicts.
template <int D>
constexpr int kORowStride = D + 8;
// NVFP4 kernels also hold the warps' rings (before the merge, in the same space).
template <int D, bool kT = false, bool kFp4 = false>
constexpr size_t decode_smem_bytes() {
  constexpr int kRows = kBlockRows<kT>;
  constexpr size_t merge =
      sizeof(float) * (kDecodeWarps * kRows * kORowStride<D> + 2 * kDecodeWarps * kRows);
  constexpr size_t ring = kFp4 ? size_t{kDecodeWarps} * Ring<D>::kWarpBytes : 0;
  return merge > ring ? merge : ring;
}

// ---- fused split combine (decode.md 7.12) -------------------------------------------------------
// The splits a fused launch may have: the last arriver keeps a row block's LSEs (then weights),
// maxima and sums in the kernel's shared memory, kRows x (splits + 2) floats.
template <int D, bool kT, bool kFp4>
constexpr int kFusedMaxSplits =
    static_cast<int>(decode_smem_bytes<D, kT, kFp4>() / sizeof(float) / kBlockRows<kT> - 2);

// The combine of one row block's items (rows (row, head) pairs: row m0 + j of the (sequence,
// kv head) group) by the whole CTA. Per item and channel it is combine_partials_kernel's
// arithmetic in its order, so that the bits equal the two-kernel path's: the max folded in split
// order by the golden's rule, w_s = expf(lse_s - m), their sum in split order, each channel's sum
// of w_s O_s in split order (one FMA per split), acc / sum rounded to BF16, m + logf(sum). Only
// the spreading differs: every item's LSEs come in one parallel load, and a thread owns 4
// channels of one item (float4 loads, 16 splits in flight). The partials were written by other
// CTAs of this launch: L2 loads (.cg), never L1.
template <int D, bool kT>
__device__ __forceinline__ void fused_combine_rows(const CombineParams& c, int64_t q_begin, int hk,
                                                   int group, int m0, int rows, float* smem) {
  const int S = c.splits;
  float* s_w = smem;            // [rows][S]: LSEs, then weights
  float* s_m = s_w + rows * S;  // [rows]
  float* s_sum = s_m + rows;    // [rows]
  auto row_of = [&](int j) { return q_begin + (m0 + j) / group; };
  auto head_of = [&](int j) { return hk * group + (m0 + j) % group; };
  __syncthreads();  // the shared memory's previous use (merge, Q, an earlier row block) is over
  for (int idx = threadIdx.x; idx < rows * S; idx += kDecodeThreads) {
    const int j = idx / S, s = idx - j * S;
    s_w[idx] = __ldcg(c.lse_part + s * c.lp_s[0] + row_of(j) * c.lp_s[1] + head_of(j) * c.lp_s[2]);
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const float* w = s_w + threadIdx.x * S;
    float m = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < S; ++s) {
      const float x = w[s];
      if (!(x <= m)) m = x;  // takes a NaN
    }
    s_m[threadIdx.x] = m;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * S; idx += kDecodeThreads) {
    const float m = s_m[idx / S];
    if (m != -INFINITY) s_w[idx] = expf(s_w[idx] - m);
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const float* w = s_w + threadIdx.x * S;
    float sum = 0.f;
    if (s_m[threadIdx.x] != -INFINITY) {
#pragma unroll 8
      for (int s = 0; s < S; ++s) sum += w[s];
    }
    s_sum[threadIdx.x] = sum;
  }
  __syncthreads();
  constexpr int kQuads = D / 4;
  for (int idx = threadIdx.x; idx < rows * kQuads; idx += kDecodeThreads) {
    const int j = idx / kQuads, c4 = 4 * (idx - j * kQuads);
    const int64_t r = row_of(j);
    const int hq = head_of(j);
    const int64_t bi = c.s_q > 0 ? r / c.s_q : r, i = c.s_q > 0 ? r % c.s_q : 0;
    uint16_t* out = c.o + bi * c.o_sb + i * c.o_si + hq * c.o_sh + c4;
    const float m = s_m[j];
    if (m == -INFINITY) {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = 0;
      continue;
    }
    const float sum = s_sum[j];
    const float* w = s_w + j * S;
    const float* o_row = c.o_part + r * c.op_s[1] + hq * c.op_s[2] + c4;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // 16 splits' loads issued before their FMAs. The last chunk's loads past S re-read split
    // S - 1 and are not used: unpredicated loads stay in flight together (predicated ones ran
    // out of predicate registers and went in groups of 2-7).
    for (int s0 = 0; s0 < S; s0 += 16) {
      float4 v[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        v[k] = __ldcg(reinterpret_cast<const float4*>(o_row + min(s0 + k, S - 1) * c.op_s[0]));
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (s0 + k < S) {
          const float ws = w[s0 + k];
          acc[0] += ws * v[k].x;
          acc[1] += ws * v[k].y;
          acc[2] += ws * v[k].z;
          acc[3] += ws * v[k].w;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat16 h = __float2bfloat16_rn(acc[k] / sum);
      out[k] = *reinterpret_cast<const uint16_t*>(&h);
    }
  }
  if (threadIdx.x < rows && c.lse != nullptr) {
    const int64_t r = row_of(threadIdx.x);
    const int64_t bi = c.s_q > 0 ? r / c.s_q : r, i = c.s_q > 0 ? r % c.s_q : 0;
    const float m = s_m[threadIdx.x];
    c.lse[bi * c.l_sb + i * c.l_si + head_of(threadIdx.x) * c.l_sh] =
        m == -INFINITY ? INFINITY : m + logf(s_sum[threadIdx.x]);
  }
}

// kT: the transposed form (7.8), for row blocks of <= 8 rows; the host picks it when every
// sequence's rows per kv head fit (decode.cu).
template <int D, bool kFp4, bool kT = false>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinBlocks<D, kFp4, kT>)
    paged_decode_kernel(const DecodeParams p) {
  constexpr int kRows = kBlockRows<kT>;
  extern __shared__ float4 smem_f4[];
  constexpr int RS = kORowStride<D>;
  float* s_o = reinterpret_cast<float*>(smem_f4);  // [warps][kRows][RS]
  float* s_m = s_o + kDecodeWarps * kRows * RS;    // [warps][kRows]
  float* s_l = s_m + kDecodeWarps * kRows;         // [warps][kRows]

  const int split = blockIdx.x;
  const int hk = blockIdx.y / p.row_blocks, rb_first = blockIdx.y % p.row_blocks;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  int64_t q_begin;
  int sq;
  if (p.s_q > 0) {
    q_begin = static_cast<int64_t>(b) * p.s_q;
    sq = p.s_q;
  } else {
    // Unchecked device values: clamped so that no row outside [0, total_q) is touched.
    const int64_t a = min(max(static_cast<int64_t>(p.cu_seqlens_q[b]), int64_t{0}), p.total_q);
    const int64_t e = min(max(static_cast<int64_t>(p.cu_seqlens_q[b + 1]), a), p.total_q);
    q_begin = a;
    sq = static_cast<int>(e - a);
  }
  const int len_raw = p.seq_lens[b];
  const bool bad_len = len_raw < 0 || static_cast<int64_t>(len_raw) >
                                          static_cast<int64_t>(p.max_pages) * p.page_size;
  const int len = bad_len ? 0 : len_raw;
  const int group = p.group;
  const int rows_total = sq * group;
  const int num_rb = (rows_total + kRows - 1) / kRows;
  const int kbeg = split * p.split_size;
  const int kend_split = min(len, kbeg + p.split_size);
  const float k_factor = kFp4 ? 256.f / __ldg(p.k.global) : __ldg(p.k.global);
  const float v_factor = kFp4 ? 256.f / __ldg(p.v.global) : __ldg(p.v.global);
  const float sl2 = p.scale_log2 * k_factor;

  for (int rb = rb_first; rb < num_rb; rb += p.row_blocks) {
    const int m0 = rb * kRows;
    const int rows = min(kRows, rows_total - m0);
    // Keys [kbeg, vis) are visible to row m (token m / group): causal bottom-right.
    auto visible_end = [&](int m) {
      if (!p.causal) return kend_split;
      return max(kbeg, min(kend_split, m / group + len - sq + 1));
    };
    const int kend = visible_end(m0 + rows - 1);

    // The previous row block's merge has read the shared memory the rings reuse.
    __syncthreads();
    // Q fragments straight from global memory (true channel order to the kernel's; padding rows
    // zero), issued after the first tiles' page-id and data loads so that the latencies overlap
    // (7.12; the shared-memory staging before the loads cost a round trip and three barriers).
    // 16-row form: A fragments (rows g, g + 8); transposed: B fragments (row g).
    constexpr int kQRegs = kT ? 2 : 4;
    uint32_t qa[D / 16][kQRegs];
    auto load_q = [&]() {
      const uint16_t* qrow[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int m = m0 + g + 8 * rr, i = m / group, hq = hk * group + m % group;
        qrow[rr] =
            p.q + (p.s_q > 0 ? b * p.q_sb + i * p.q_si : (q_begin + i) * p.q_sb) + hq * p.q_sh;
      }
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
        for (int reg = 0; reg < kQRegs; ++reg) {
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
    };

    // The lane's two rows: g, g + 8 (16-row form) or 2t, 2t + 1 (transposed).
    int vis[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = kT ? 2 * t + rr : g + 8 * rr;
      vis[rr] = r < rows ? visible_end(m0 + r) : kbeg;
    }
    std::conditional_t<kT, WarpStateT<D>, WarpState<D>> st;
    constexpr int kOTiles = kT ? D / 16 : D / 8;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[n][e] = 0.f;
    }
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
    bool bad = bad_len;

    constexpr int kStride = kDecodeTile * kDecodeWarps;
    if constexpr (kFp4) {
      // NVFP4: the warp's shared-memory ring, kRingStages - 1 tiles in flight (7.10).
      using R = Ring<D>;
      uint8_t* ring = reinterpret_cast<uint8_t*>(smem_f4) + warp * R::kWarpBytes;
      const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
      const RingLane rl = ring_lane<D>(p, hk, lane);
      const int32_t* bt_row = p.block_tables + b * p.bt_s0;
      int kt_in = kbeg + kDecodeTile * warp;  // the next tile to issue
      int32_t pg[kRingStages];                // page ids of the first stages, loaded together
#pragma unroll
      for (int i = 0; i < kRingStages; ++i)
        pg[i] = tile_page_row(p, bt_row, kt_in + i * kStride, kend);
#pragma unroll
      for (int i = 0; i < kRingStages - 1; ++i) {
        if (kt_in < kend) {
          ring_issue<D>(p, b, kt_in, kend, pg[i], lane, rl, ring_s + i * R::kStage, &bad);
        }
        cp_async_commit();  // (an empty group for a missing tile keeps the wait count right)
        kt_in += kStride;
      }
      load_q();
      int32_t page_next = pg[kRingStages - 1];  // the page ids run one tile ahead of the copies
      // Byte offsets of the stage to read and of the stage to refill (the one read in the
      // previous iteration; the __syncwarp at the end of an iteration ordered those reads).
      uint32_t rd = 0, in = (kRingStages - 1) * R::kStage;
      for (int kt = kbeg + kDecodeTile * warp; kt < kend; kt += kStride) {
        const int32_t page_after = tile_page_row(p, bt_row, kt_in + kStride, kend);
        if (kt_in < kend) ring_issue<D>(p, b, kt_in, kend, page_next, lane, rl, ring_s + in, &bad);
        cp_async_commit();
        page_next = page_after;
        kt_in += kStride;
        cp_async_wait<kRingStages - 1>();  // this lane's copies of tile kt have landed
        __syncwarp();                      // and every lane's are visible
        RawTile<D, kFp4> r;
        ring_read<D>(ring + rd, g, t, r);
        if constexpr (kT) {
          compute_tile_t<D, kFp4>(r, qa, kt, vis, sl2, g, st);
        } else {
          compute_tile<D, kFp4>(r, qa, kt, vis, sl2, t, st);
        }
        __syncwarp();
        in = rd;
        rd = rd == (kRingStages - 1) * R::kStage ? 0 : rd + R::kStage;
      }
      cp_async_wait<0>();
      __syncthreads();  // the merge below reuses the rings' shared memory
    } else {
      // Register double buffering: the next tile's loads are issued before this tile's math.
      // The page ids run one tile further ahead (tile_page).
      int kt = kbeg + kDecodeTile * warp;
      RawTile<D, kFp4> ra, rbuf;
      if (kt < kend)
        load_tile<D, kFp4>(p, b, hk, kt, kend, tile_page(p, b, kt, kend), g, t, ra, &bad);
      load_q();
      int32_t page_next = tile_page(p, b, kt + kStride, kend);
      while (kt < kend) {
        int32_t page_after = tile_page(p, b, kt + 2 * kStride, kend);
        if (kt + kStride < kend) {
          load_tile<D, kFp4>(p, b, hk, kt + kStride, kend, page_next, g, t, rbuf, &bad);
        }
        page_next = page_after;
        if constexpr (kT) {
          compute_tile_t<D, kFp4>(ra, qa, kt, vis, sl2, g, st);
        } else {
          compute_tile<D, kFp4>(ra, qa, kt, vis, sl2, t, st);
        }
        kt += kStride;
        if (kt >= kend) break;
        page_after = tile_page(p, b, kt + 2 * kStride, kend);
        if (kt + kStride < kend) {
          load_tile<D, kFp4>(p, b, hk, kt + kStride, kend, page_next, g, t, ra, &bad);
        }
        page_next = page_after;
        if constexpr (kT) {
          compute_tile_t<D, kFp4>(rbuf, qa, kt, vis, sl2, g, st);
        } else {
          compute_tile<D, kFp4>(rbuf, qa, kt, vis, sl2, t, st);
        }
        kt += kStride;
      }
    }

    // Warp results to shared memory: O in true channel order, m and the quad's l per row.
    float* wo = s_o + warp * kRows * RS;
    if constexpr (kT) {
      // Row 2t + rr's l is spread over the 8 lanes of one t.
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 4);
        st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 8);
        st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 16);
      }
      // M-tile i, element e: channel phys_ot(i, g + 8 (e >> 1)) = phys_o(2i + (e >> 1), g).
#pragma unroll
      for (int i = 0; i < D / 16; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          wo[ot_row(t, e) * RS + 8 * (2 * i + (e >> 1)) + g] = st.o[i][e];
        }
      }
      if (g == 0) {
        s_m[warp * kRows + 2 * t] = st.m[0];
        s_m[warp * kRows + 2 * t + 1] = st.m[1];
        s_l[warp * kRows + 2 * t] = st.l[0];
        s_l[warp * kRows + 2 * t + 1] = st.l[1];
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 1);
        st.l[rr] += __shfl_xor_sync(0xFFFFFFFFu, st.l[rr], 2);
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
          wo[row * RS + 8 * n + col] = st.o[n][e];
        }
      }
      if (t == 0) {
        s_m[warp * kRows + g] = st.m[0];
        s_m[warp * kRows + g + 8] = st.m[1];
        s_l[warp * kRows + g] = st.l[0];
        s_l[warp * kRows + g + 8] = st.l[1];
      }
    }
    const bool any_bad = __syncthreads_or(bad);

    // Merge the warps and write: 8 threads per row, d/8 consecutive channels each.
    const int row = threadIdx.x / 8, part = threadIdx.x % 8;
    if (row < rows) {
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w * kRows + row]);
      const float ref = mx == -INFINITY ? 0.f : mx;
      float f[kDecodeWarps], l = 0.f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        f[w] = fast_exp2(s_m[w * kRows + row] - ref);
        l += f[w] * s_l[w * kRows + row];
      }
      const float nan = __int_as_float(0x7FC00000);
      const float inv = l > 0.f ? v_factor / l : 0.f;
      float row_lse;  // natural log
      if (any_bad || l != l) {
        row_lse = nan;
      } else if (l > 0.f) {
        row_lse = (ref + __log2f(l)) * 0.6931471805599453f;
      } else {
        row_lse = p.write_partials ? -INFINITY : INFINITY;
      }
      const int m = m0 + row, i = m / group, hq = hk * group + m % group;
      const int64_t grow = q_begin + i;
      if (p.write_partials) {
        float* dst = p.o_part + ((static_cast<int64_t>(split) * p.total_q + grow) * p.h + hq) * D;
        for (int n = 0; n < D / 8; ++n) {
          const int c = phys_o<D>(n, part);
          float acc = 0.f;
#pragma unroll
          for (int w = 0; w < kDecodeWarps; ++w) {
            acc += f[w] * s_o[(w * kRows + row) * RS + 8 * n + part];
          }
          dst[c] = any_bad ? nan : (l > 0.f ? acc * inv : (l == 0.f ? 0.f : nan));
        }
        if (part == 0) {
          p.lse_part[(static_cast<int64_t>(split) * p.total_q + grow) * p.h + hq] = row_lse;
        }
      } else {
        const int64_t base = (p.s_q > 0 ? b * p.o_sb + i * p.o_si : grow * p.o_sb) + hq * p.o_sh;
        for (int n = 0; n < D / 8; ++n) {
          const int c = phys_o<D>(n, part);
          float acc = 0.f;
#pragma unroll
          for (int w = 0; w < kDecodeWarps; ++w) {
            acc += f[w] * s_o[(w * kRows + row) * RS + 8 * n + part];
          }
          const float val = any_bad ? nan : (l > 0.f ? acc * inv : (l == 0.f ? 0.f : nan));
          const __nv_bfloat16 h = __float2bfloat16_rn(val);
          p.o[base + c] = *reinterpret_cast<const uint16_t*>(&h);
        }
        if (part == 0 && p.lse != nullptr) {
          p.lse[(p.s_q > 0 ? b * p.l_sb + i * p.l_si : grow * p.l_sb) + hq * p.l_sh] = row_lse;
        }
      }
    }
  }

  if (p.counters != nullptr) {
    // Fused combine (7.12): the group's counter is its first item's; a group without items
    // (no query rows) has nothing to merge. Uniform over the CTA.
    const int m_first = rb_first * kRows;
    if (m_first >= rows_total) return;
    // Arrive once this CTA's partials are visible device-wide: every thread's fence, then the
    // barrier, then one atomic (the last-arriver pattern).
    __threadfence();
    __syncthreads();
    bool last = false;
    if (threadIdx.x == 0) {
      int32_t* ctr = p.counters + (q_begin + m_first / group) * p.h + hk * group + m_first % group;
      last = atomicAdd(ctr, 1) == p.num_splits - 1;
      if (last) {
        atomicExch(ctr, 0);  // every other split has arrived: the next launch finds it zero
        __threadfence();     // the other CTAs' partials are read after their arrivals
      }
    }
    if (!__syncthreads_or(last)) return;
    // The merge's order is the split order, whichever CTA arrives last: deterministic.
    for (int rb = rb_first; rb < num_rb; rb += p.row_blocks) {
      const int m0 = rb * kRows;
      fused_combine_rows<D, kT>(p.comb, q_begin, hk, group, m0, min(kRows, rows_total - m0),
                                reinterpret_cast<float*>(smem_f4));
    }
  }
}

// ---- split combine ------------------------------------------------------------------------------

// One CTA per (row, head) item (grid-stride), the float64 combine's math in FP32 with its order
// of operations, so that its bits do not depend on how the work is spread: the max by the
// golden's sequential rule, the sum in split order, each channel's sum of w_s O_s in split order.
// The old form (one warp per item, each lane looping over every split for each of its channels)
// ran ~splits x d/32 dependent L2 round trips with only total_q x h warps in flight: at b = 1 and
// 64 splits, 32 warps on 8 SMs for tens of microseconds (decode.md 7.10). Here the LSEs come in
// one parallel load, the weights are computed once per split into shared memory, and each thread
// owns one channel, its split loads independent of each other (unrolled).
constexpr int kCombineThreads = 128;
constexpr int kCombineSmemSplits = 1024;  // weights kept in shared memory; beyond, recomputed

__global__ void __launch_bounds__(kCombineThreads) combine_partials_kernel(const CombineParams p) {
  __shared__ float s_w[kCombineSmemSplits];
  const int64_t items = p.total_q * p.h;
  const int nsm = min(p.splits, kCombineSmemSplits);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t r = item / p.h;
    const int hq = static_cast<int>(item % p.h);
    const float* lse_row = p.lse_part + r * p.lp_s[1] + hq * p.lp_s[2];
    const float* o_row = p.o_part + r * p.op_s[1] + hq * p.op_s[2];
    __syncthreads();  // s_w of the previous item is consumed
    for (int s = threadIdx.x; s < nsm; s += kCombineThreads) s_w[s] = lse_row[s * p.lp_s[0]];
    __syncthreads();
    auto lse_at = [&](int s) { return s < nsm ? s_w[s] : lse_row[s * p.lp_s[0]]; };
    // Every thread folds the max itself, in split order (shared-memory broadcasts): the golden's
    // rule takes a NaN and restarts after it, an order-dependent fold.
    float m = -INFINITY;
    for (int s = 0; s < p.splits; ++s) {
      const float x = lse_at(s);
      if (!(x <= m)) m = x;  // takes a NaN
    }
    const int64_t bi = p.s_q > 0 ? r / p.s_q : r, i = p.s_q > 0 ? r % p.s_q : 0;
    uint16_t* out = p.o + bi * p.o_sb + i * p.o_si + hq * p.o_sh;
    if (m == -INFINITY) {  // uniform over the CTA
      for (int c = threadIdx.x; c < p.d; c += kCombineThreads) out[c] = 0;
      if (threadIdx.x == 0 && p.lse != nullptr) {
        p.lse[bi * p.l_sb + i * p.l_si + hq * p.l_sh] = INFINITY;
      }
      continue;
    }
    __syncthreads();  // every thread has read the LSEs
    for (int s = threadIdx.x; s < nsm; s += kCombineThreads) s_w[s] = expf(s_w[s] - m);
    __syncthreads();
    auto w_at = [&](int s) { return s < nsm ? s_w[s] : expf(lse_row[s * p.lp_s[0]] - m); };
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += w_at(s);
    for (int c = threadIdx.x; c < p.d; c += kCombineThreads) {
      float acc = 0.f;
      if (p.splits <= kCombineSmemSplits) {
        // Every weight in shared memory: no branch per split, so the unrolled loads are all in
        // flight together (with w_at's branch ptxas issued each load right before its FMA: one
        // L2 round trip per split, ~0.4 us, 7.12). The same operations in the same order.
#pragma unroll 16
        for (int s = 0; s < p.splits; ++s) acc += s_w[s] * o_row[s * p.op_s[0] + c];
      } else {
#pragma unroll 16
        for (int s = 0; s < p.splits; ++s) acc += w_at(s) * o_row[s * p.op_s[0] + c];
      }
      const __nv_bfloat16 h = __float2bfloat16_rn(acc / sum);
      out[c] = *reinterpret_cast<const uint16_t*>(&h);
    }
    if (threadIdx.x == 0 && p.lse != nullptr) {
      p.lse[bi * p.l_sb + i * p.l_si + hq * p.l_sh] = m + logf(sum);
    }
  }
}

}  // namespace fp4attn::paged
