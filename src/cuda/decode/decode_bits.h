// The integer side of the paged decode kernel (decode_kernel.cuh), host and device: the E2M1 ->
// BF16 bit trick and the lane <-> channel / key maps of its MMA fragments. Kept apart from the
// kernel so that a CPU test (tests/formats/test_decode_bits.cc) checks them exhaustively and
// emulates the kernel's fragments with the PTX layouts of mma.m16n8k16 on a machine without a
// GPU. docs/kernels/decode.md has the reasoning.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"

namespace fp4attn::paged {

// 8 E2M1 codes (packed, element 2j in the low nibble of byte j) -> 4 BF16x2 words of e2m1 *
// 2^-126: word q holds nibble q (low half) and nibble q + 4 (high half). The magnitude bits go to
// BF16 bits 8..6 (exponent field ee, top mantissa bit m: 2^(ee-127)(1 + m/2), and code 1 becomes
// the subnormal 2^-127, all e2m1 * 2^-126), the sign to bit 15; one multiply places both, since
// the two shifted copies of a masked nibble never overlap.
FP4ATTN_HD void e2m1x8_to_bf16(uint32_t x, uint32_t (&w)[4]) {
  constexpr uint32_t kKeep = 0x81C081C0u;
  const uint32_t hi = x >> 8;
  w[0] = ((x & 0x000F000Fu) * 0x1040u) & kKeep;   // << 6 and << 12
  w[1] = ((x & 0x00F000F0u) * 0x0104u) & kKeep;   // << 2 and << 8
  w[2] = ((hi & 0x000F000Fu) * 0x1040u) & kKeep;  // nibbles 2, 6
  w[3] = ((hi & 0x00F000F0u) * 0x0104u) & kKeep;  // nibbles 3, 7
}

// CUDA's __byte_perm: byte n of the result is byte (s >> 4n) & 7 of {y:x}.
FP4ATTN_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t xy = (uint64_t{y} << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n)
    r |= static_cast<uint32_t>((xy >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r;
#endif
}

// NVFP4 V: bytes {A.b(2h), A.b(2h+1), B.b(2h), B.b(2h+1)} of two keys' words, so that
// e2m1x8_to_bf16 pairs (key A, key B) at channels 4h + q of the word (q = 0..3).
FP4ATTN_HD uint32_t nvfp4_key_pair(uint32_t a, uint32_t b, int half) {
  return byte_perm(a, b, half ? 0x7632u : 0x5410u);
}

// Channel of k index kk (0..15) in k-step ks of the S = Q K^T MMA: NVFP4 lane t' = (kk & 7) / 2
// reads d/4 channels from (d/4) t'; word i of them gives k-steps 2i, 2i + 1 as pairs (q, q + 4).
template <int D>
FP4ATTN_HD int phys_k_nvfp4(int ks, int kk) {
  const int t = (kk & 7) >> 1, hpair = kk & 1, r = kk >> 3;
  return (D / 4) * t + 8 * (ks >> 1) + 2 * (ks & 1) + r + 4 * hpair;
}
// FP8: lane t' reads d/4 bytes from (d/4) t'; word ks gives b0 = (0, 1), b1 = (2, 3).
template <int D>
FP4ATTN_HD int phys_k_fp8(int ks, int kk) {
  const int t = (kk & 7) >> 1, hpair = kk & 1, r = kk >> 3;
  return (D / 4) * t + 4 * ks + 2 * r + hpair;
}

// P V: n-tile j, column col (0..7) of the output <-> channel (d/8) col + j; lane group g reads
// the d/8 channels from (d/8) g of its keys.
template <int D>
FP4ATTN_HD int phys_o(int j, int col) {
  return (D / 8) * col + j;
}

// The 4 keys (of the 16-key tile) a lane (g, t) reads for the P V MMA, in B-register order:
// b0 = {2t, 2t + 1}, b1 = {2t + 8, 2t + 9}.
FP4ATTN_HD int v_key(int t, int j) { return 2 * t + (j & 1) + 8 * (j >> 1); }

// ---- the transposed form (<= 8 query rows per kv head) ------------------------------------------
// S^T = K Q^T and O^T = V^T P^T with mma.m16n8k16: the 16 keys of a tile (S) and 16 channels (O)
// are the MMA's M, the (up to 8) query rows its N. The loads and the dequantization are those of
// the 16-row form; only the fragments they feed change.
//
// S^T, k-step ks: A = K (M = key, K = channel) wants, in lane (g, t), keys g (a0, a2) and g + 8
// (a1, a3) at k indices 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3): the 16-row form's B
// registers {b0, b1} of its key slots 0 (key g) and 1 (key g + 8) at the same k-step, so the
// channel maps phys_k_* stay. b0 / b1 of slot j: (lo, hi) here.
FP4ATTN_HD void kt_a_frag(uint32_t lo0, uint32_t hi0, uint32_t lo1, uint32_t hi1,
                          uint32_t (&a)[4]) {
  a[0] = lo0;
  a[1] = lo1;
  a[2] = hi0;
  a[3] = hi1;
}

// B = Q^T (K = channel, N = row): lane (g, t) register r holds row g at k indices 2t + 8r + {0, 1}:
// the 16-row form's A register 2r (its row g half).
FP4ATTN_HD int qt_b_kidx(int t, int r) { return 2 * t + 8 * r; }

// C = S^T, element e of lane (g, t): key g + 8 (e >> 1) of the tile, row 2t + (e & 1).
FP4ATTN_HD int st_key(int g, int e) { return g + 8 * (e >> 1); }
FP4ATTN_HD int st_row(int t, int e) { return 2 * t + (e & 1); }

// P^T to the B operand of O^T = V^T P^T (K = key, N = row): lane (g, t) needs row g at keys
// 2t + {0, 1} (b0) and 2t + 8 + {0, 1} (b1). The C fragment has keys on g and rows on t, the
// transpose: no choice of key or row order removes it (C's M index lives on g, every operand's K
// index on t). Packed as BF16x2 {C e0, e1} (keys 0..7) and {C e2, e3} (keys 8..15), each is an
// 8x8 matrix in the m8n8 fragment layout (lane (g, t): row g, columns 2t, 2t + 1) with keys as
// rows; movmatrix.trans turns it into rows-as-rows, which is b0 / b1 with the identity key order.
// The K index of O^T = V^T P^T is then key kk, so V keeps its loads: lane (g, t) reads keys
// v_key(t, 0..3) = 2t, 2t + 1, 2t + 8, 2t + 9.

// A = V^T (M = channel, K = key): lane (g, t) holds channels m = g (a0, a2) and g + 8 (a1, a3) of
// M-tile i at keys 2t + {0, 1} (a0, a1) and 2t + 8 + {0, 1} (a2, a3). Channel of M index m
// (0..15) of M-tile i (0..d/16): lane group g owns [g d/8, (g + 1) d/8) as in the 16-row form,
// M-tile i = its n-tiles 2i (m < 8) and 2i + 1 (m >= 8).
template <int D>
FP4ATTN_HD int phys_ot(int i, int m) {
  return phys_o<D>(2 * i + (m >> 3), m & 7);
}
// The 16-row form's B registers of n-tiles 2i (b0 = lo0, b1 = hi0) and 2i + 1 (lo1, hi1) make
// the A fragment of M-tile i.
FP4ATTN_HD void vt_a_frag(uint32_t lo0, uint32_t hi0, uint32_t lo1, uint32_t hi1,
                          uint32_t (&a)[4]) {
  a[0] = lo0;
  a[1] = lo1;
  a[2] = hi0;
  a[3] = hi1;
}

// C = O^T, element e of lane (g, t): channel phys_ot(i, g + 8 (e >> 1)), row 2t + (e & 1).
FP4ATTN_HD int ot_row(int t, int e) { return 2 * t + (e & 1); }

// ---- the NVFP4 shared-memory ring ---------------------------------------------------------------
// A stage holds one 16-key tile: K data, V data [16 keys][kPitch] (kPitch = d/2 + 16 bytes, so
// that the V reads of keys 2t, 2t + 2, 2t + 4, 2t + 6 fall on distinct banks), then K scales and
// V scales [16 keys][d/16]. Lane (g, t) copies the d/8-byte chunk t of keys g and g + 8 of K and
// of V (unit j = 0, 1: key g + 8 j); lane l copies the scale row of key l & 15, K for l < 16 and V
// otherwise. The reads give each lane the bytes the register path loads (RawTile): K chunk t of
// keys g, g + 8, V bytes [g d/16, (g + 1) d/16) of keys v_key(t, j), K scale bytes of blocks
// 2t, 2t + 1 (d = 128) or t (d = 64), V scale byte of block g (d = 128) or g / 2 (d = 64).
template <int D>
struct RingLayout {
  static constexpr int kPitch = D / 2 + 16;
  static constexpr int kKd = 0;
  static constexpr int kVd = 16 * kPitch;
  static constexpr int kKs = 32 * kPitch;
  static constexpr int kVs = kKs + 16 * (D / 16);
  static constexpr int kStage = kVs + 16 * (D / 16);
};
// Copies: stage offset of data unit j (key g + 8 j, chunk t) of K (v = false) or V.
template <int D>
FP4ATTN_HD int ring_data_dst(bool v, int g, int t, int j) {
  using L = RingLayout<D>;
  return (v ? L::kVd : L::kKd) + (g + 8 * j) * L::kPitch + t * (D / 8);
}
// Stage offset of lane's scale row (key lane & 15; K for lanes < 16).
template <int D>
FP4ATTN_HD int ring_scale_dst(int lane) {
  using L = RingLayout<D>;
  return (lane >= 16 ? L::kVs : L::kKs) + (lane & 15) * (D / 16);
}
// Reads: K word chunk of key slot j, V chunk of key v_key(t, j), K scale bytes of slot j (2 at
// d = 128, low byte first), V scale byte of key v_key(t, j).
template <int D>
FP4ATTN_HD int ring_k_src(int g, int t, int j) {
  return RingLayout<D>::kKd + (g + 8 * j) * RingLayout<D>::kPitch + t * (D / 8);
}
template <int D>
FP4ATTN_HD int ring_v_src(int g, int t, int j) {
  return RingLayout<D>::kVd + v_key(t, j) * RingLayout<D>::kPitch + g * (D / 16);
}
template <int D>
FP4ATTN_HD int ring_ks_src(int g, int t, int j) {
  return RingLayout<D>::kKs + (g + 8 * j) * (D / 16) + (D == 128 ? 2 * t : t);
}
template <int D>
FP4ATTN_HD int ring_vs_src(int g, int t, int j) {
  return RingLayout<D>::kVs + v_key(t, j) * (D / 16) + (D == 128 ? g : g / 2);
}

}  // namespace fp4attn::paged
