// mma.sync m16n8k32 with FP8 operands (sm_89+; A and B may mix E4M3 and E5M2) and the fragment
// loads of the backward's shared-memory tiles (PTX ISA, "Matrix fragments for mma.m16n8k32"):
// with g = lane / 4 and t = lane % 4,
//   A (16 x 32, row-major): reg0 = row g, k 4t..4t+3; reg1 = row g+8, same k; reg2/reg3 = the
//     same rows at k 16+4t..16+4t+3 (byte i of a register = k position 4t+i);
//   B (32 x 8, "col"): reg0 = column n = g, k 4t..4t+3; reg1 = k 16+4t..;
//   C (16 x 8, FP32): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8.
// Every tile is stored with its k index contiguous (row pitch a multiple of 16 bytes, padded by
// 16 so that the 8 rows g of one load fall in distinct banks).
#pragma once

#include <cstdint>

namespace fp4attn::bwd {

__device__ __forceinline__ void mma_e4m3_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A E4M3, B E5M2 (dO).
__device__ __forceinline__ void mma_e4m3_e5m2(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of rows r0..r0+15, k k0..k0+31 of a [row][k] tile with `pitch` bytes per row.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint8_t* tile, int pitch, int r0,
                                       int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint8_t* p = tile + (r0 + g) * pitch + k0 + 4 * t;
  a[0] = lds32(p);
  a[1] = lds32(p + 8 * pitch);
  a[2] = lds32(p + 16);
  a[3] = lds32(p + 8 * pitch + 16);
}

// B fragment of columns n0..n0+7, k k0..k0+31 of an [n][k] tile.
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const uint8_t* tile, int pitch,
                                       int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint8_t* p = tile + (n0 + g) * pitch + k0 + 4 * t;
  b0 = lds32(p);
  b1 = lds32(p + 16);
}

// Two FP32 to E4M3 (RNE, satfinite; NaN -> 0x7F): lo in bits 0-7, hi in bits 8-15.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t e4m3x4(float b0, float b1, float b2, float b3) {
  return e4m3x2(b0, b1) | (e4m3x2(b2, b3) << 16);
}

// The A fragment (k = 32 queries) made from four C fragments x[nt] (queries 8nt..8nt+7) of a
// 16-row accumulator, for B operands whose queries are stored in the permuted order of
// bwd_bits.h: k position 4t+i holds query {2t, 2t+1, 2t+8, 2t+9}[i] of its 16-group, which is
// what this thread's c0, c1 of tiles 2u and 2u+1 hold.
__device__ __forceinline__ void accum_to_a(uint32_t (&a)[4], const float (&x)[4][4]) {
  a[0] = e4m3x4(x[0][0], x[0][1], x[1][0], x[1][1]);
  a[1] = e4m3x4(x[0][2], x[0][3], x[1][2], x[1][3]);
  a[2] = e4m3x4(x[2][0], x[2][1], x[3][0], x[3][1]);
  a[3] = e4m3x4(x[2][2], x[2][3], x[3][2], x[3][3]);
}

}  // namespace fp4attn::bwd
