// The paged decode's dequantization of a raw tile (RawTile) to BF16 MMA operands, exactly: E2M1
// codes times their E4M3 block scales (NVFP4) or E4M3 codes (FP8) to BF16x2 words
// (docs/kernels/decode.md has the bit budget). Both forms of the tile compute build their
// fragments from these words: the 16-row form takes them as B registers, the transposed form
// regroups the same words into A fragments (kt_a_frag, vt_a_frag).
#pragma once

#include <cstdint>

#include "cuda/decode/decode_bits.h"
#include "cuda/decode/tile_loads.cuh"
#include "cuda/sm90/bf16x2.cuh"

namespace fp4attn::paged {

// Two E4M3 block scales (low byte first) -> BF16x2 of scale * 2^118, exact: an E4M3 value has 4
// significant bits and 448 * 2^118 < 2^127. Times an E2M1 code read as e2m1 * 2^-126
// (e2m1x8_to_bf16), the product is e2m1 * scale * 2^-8 in [2^-18, 10.5], exact in BF16.
constexpr float kScaleBias = 3.3230699894622794e35f;  // 2^118
__device__ __forceinline__ uint32_t scale_pair_bf16(uint32_t two_codes) {
  const float2 f = sm90::e4m3x2_to_float2(two_codes);
  return sm90::pack_bf16x2(f.x * kScaleBias, f.y * kScaleBias);
}

// ---- K ------------------------------------------------------------------------------------------

// NVFP4: a K slot's block scales (RawTile::ks) as one BF16x2 (d = 128: blocks 0, 1; d = 64: the
// one block twice), so that each word takes its block's half by the HMUL2 operand selector (one
// conversion per key, not two).
template <int D>
__device__ __forceinline__ uint32_t k_scale_pair(uint32_t ks) {
  return scale_pair_bf16(D == 128 ? ks : ks * 0x101u);
}

// NVFP4: word i of a K slot (channels (d/4) t + 8 i .. + 8, scale block ((d/4) t + 8 i) / 16) ->
// the B registers of k-steps 2 i (w[0], w[1]) and 2 i + 1 (w[2], w[3]).
template <int D>
__device__ __forceinline__ void k_words_nvfp4(uint32_t word, int i, uint32_t sc, uint32_t (&w)[4]) {
  e2m1x8_to_bf16(word, w);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[q] = (D == 128 && (i >> 1)) ? sm90::bf16x2_mul_bcast<1>(w[q], sc)
                                  : sm90::bf16x2_mul_bcast<0>(w[q], sc);
  }
}

// FP8: word ks of a K slot -> the B registers {lo, hi} of k-step ks.
__device__ __forceinline__ void k_words_fp8(uint32_t x, uint32_t& lo, uint32_t& hi) {
  const float2 a = sm90::e4m3x2_to_float2(x & 0xFFFFu), b = sm90::e4m3x2_to_float2(x >> 16);
  lo = sm90::pack_bf16x2(a.x, a.y);
  hi = sm90::pack_bf16x2(b.x, b.y);
}

// ---- V ------------------------------------------------------------------------------------------
// The lane's four V keys (RawTile::v, keys 2t, 2t + 1, 2t + 8, 2t + 9) as the 16-row form's P V
// B registers: b0 from keys (2t, 2t + 1), b1 from (2t + 8, 2t + 9); n-tile j = the lane group's
// channel j.

// NVFP4: the keys' block scales as two BF16x2, keys (2t, 2t + 1) and (2t + 8, 2t + 9).
template <int D>
__device__ __forceinline__ void v_scale_pairs(const RawTile<D, true>& r, uint32_t& sc0,
                                              uint32_t& sc1) {
  sc0 = scale_pair_bf16(r.vs[0] | r.vs[1] << 8);
  sc1 = scale_pair_bf16(r.vs[2] | r.vs[3] << 8);
}

// NVFP4: word i, half `half` -> n-tiles 8 i + 4 half + q (q = 0..3): b0[q], b1[q].
template <int D>
__device__ __forceinline__ void v_words_nvfp4(const RawTile<D, true>& r, int i, int half,
                                              uint32_t sc0, uint32_t sc1, uint32_t (&b0)[4],
                                              uint32_t (&b1)[4]) {
  // Bytes {A.b(2h), A.b(2h+1), B.b(2h), B.b(2h+1)}: nibble q = A channel q, q + 4 = B.
  uint32_t w0[4], w1[4];
  e2m1x8_to_bf16(nvfp4_key_pair(r.v[0][i], r.v[1][i], half), w0);
  e2m1x8_to_bf16(nvfp4_key_pair(r.v[2][i], r.v[3][i], half), w1);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    b0[q] = sm90::bf16x2_mul(w0[q], sc0);
    b1[q] = sm90::bf16x2_mul(w1[q], sc1);
  }
}

// FP8: word i, half `half` -> n-tiles 4 i + 2 half ({x0, x1}: the .x channel of each code pair)
// and 4 i + 2 half + 1 ({y0, y1}: the .y channel).
template <int D>
__device__ __forceinline__ void v_words_fp8(const RawTile<D, false>& r, int i, int half,
                                            uint32_t (&x)[2], uint32_t (&y)[2]) {
  const uint32_t sh = 16 * half;
  const float2 a = sm90::e4m3x2_to_float2(r.v[0][i] >> sh),
               b = sm90::e4m3x2_to_float2(r.v[1][i] >> sh);
  const float2 c = sm90::e4m3x2_to_float2(r.v[2][i] >> sh),
               d = sm90::e4m3x2_to_float2(r.v[3][i] >> sh);
  x[0] = sm90::pack_bf16x2(a.x, b.x);
  x[1] = sm90::pack_bf16x2(c.x, d.x);
  y[0] = sm90::pack_bf16x2(a.y, b.y);
  y[1] = sm90::pack_bf16x2(c.y, d.y);
}

}  // namespace fp4attn::paged
