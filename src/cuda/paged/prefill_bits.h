// The integer side of the paged prefill repack kernel (prefill_repack.cu), host and device: the
// NVFP4 fold of 8 codes through a per-block byte table and the 4 x 4 byte transpose that turns 4
// keys' channel bytes into V^T words. Kept apart from the kernel so that a CPU test
// (tests/formats/test_prefill_bits.cc) checks them against paged_prefill_fold_nvfp4 for every
// (code, scale) pair and every byte position. docs/kernels/decode.md, "Paged prefill".
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn::paged {

// PTX prmt.b32 (default mode): byte n of the result is byte (s >> 4n) & 7 of {b:a}, or, when bit
// 3 of that selector nibble is set, the sign (bit 7) of that byte replicated over all 8 bits.
FP4ATTN_HD uint32_t prmt_sign(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  const uint64_t ab = (uint64_t{b} << 32) | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>((ab >> (8 * (sel & 7))) & 0xFF);
    if (sel & 8) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
    r |= byte << (8 * n);
  }
  return r;
#endif
}

// Two FP32 values to E4M3 bytes (lo in bits 0..7): float_to_e4m3 of each. On the device the
// hardware cvt.rn.satfinite.e4m3x2.f32, equal to float_to_e4m3 for every finite float (swept in
// tests/cuda/test_e4m3_hw.cu); the fold only converts finite values.
FP4ATTN_HD uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(float_to_e4m3(lo)) | (static_cast<uint32_t>(float_to_e4m3(hi)) << 8);
#endif
}

// The fold table of one NVFP4 block scale: byte m (0..7) of {hi:lo} is the operand code of the
// positive E2M1 magnitude m, E4M3_RNE(e2m1(m) * scale / 8) (paged_prefill_fold_nvfp4). A
// negative code folds to the same byte with bit 7 flipped (RNE is symmetric; 0 * a negative scale
// is -0 -> 0x80, and a negative code then gives +0 -> 0x00: the flip covers it too). A NaN scale
// (0x7F / 0xFF) is the caller's: every code folds to 0x7F.
struct FoldTable {
  uint32_t lo, hi;
};
FP4ATTN_HD FoldTable fold_table(uint8_t scale) {
  const float f = e4m3_to_float(scale) * 0.125f;  // exact: a power-of-two step of an E4M3 value
  FoldTable t;
  t.lo = e4m3x2(0.f * f, 0.5f * f) | (e4m3x2(1.f * f, 1.5f * f) << 16);
  t.hi = e4m3x2(2.f * f, 3.f * f) | (e4m3x2(4.f * f, 6.f * f) << 16);
  return t;
}

// 4 E2M1 codes (nibbles of the low 16 bits of `codes`, element k in bits 4k..4k+3) -> their 4
// operand bytes (element k in byte k): the magnitude picks its table byte (prmt with the sign bits
// cleared), and a prmt in sign mode over 0x80 bytes yields 0xFF for a negative code and 0x80 for a
// positive one, whose bit 0 moved to bit 7 is the sign flip.
FP4ATTN_HD uint32_t fold4(uint32_t codes, const FoldTable& t) {
  const uint32_t mag = prmt_sign(t.lo, t.hi, codes & 0x7777u);
  const uint32_t neg = prmt_sign(0x80808080u, 0x80808080u, codes & 0xFFFFu);
  return mag ^ ((neg << 7) & 0x80808080u);
}

// 16 packed codes (8 bytes, element 2j in the low nibble of byte j) with their block scale ->
// 16 operand bytes (element c in byte c % 4 of word c / 4).
FP4ATTN_HD void fold16(uint32_t w0, uint32_t w1, uint8_t scale, uint32_t (&out)[4]) {
  if ((scale & 0x7Fu) == 0x7Fu) {
    out[0] = out[1] = out[2] = out[3] = 0x7F7F7F7Fu;
    return;
  }
  const FoldTable t = fold_table(scale);
  out[0] = fold4(w0, t);
  out[1] = fold4(w0 >> 16, t);
  out[2] = fold4(w1, t);
  out[3] = fold4(w1 >> 16, t);
}

// 4 x 4 byte transpose: x[k] holds 4 channel bytes of key k; out[j] gets byte j of each key, key
// k in byte k (the V^T word of channel j at 4 consecutive key positions).
FP4ATTN_HD void transpose4x4(const uint32_t (&x)[4], uint32_t (&out)[4]) {
  const uint32_t a_lo = prmt_sign(x[0], x[1], 0x5140u);  // x0.b0 x1.b0 x0.b1 x1.b1
  const uint32_t a_hi = prmt_sign(x[0], x[1], 0x7362u);  // x0.b2 x1.b2 x0.b3 x1.b3
  const uint32_t b_lo = prmt_sign(x[2], x[3], 0x5140u);
  const uint32_t b_hi = prmt_sign(x[2], x[3], 0x7362u);
  out[0] = prmt_sign(a_lo, b_lo, 0x5410u);
  out[1] = prmt_sign(a_lo, b_lo, 0x7632u);
  out[2] = prmt_sign(a_hi, b_hi, 0x5410u);
  out[3] = prmt_sign(a_hi, b_hi, 0x7632u);
}

// The 4 keys (offsets in their 16-key group) whose V^T positions are 4 q .. 4 q + 3, q = 0..3
// (operand_v_key_at): 2q, 2q + 1, 2q + 8, 2q + 9.
FP4ATTN_HD int v_quad_key(int q, int k) { return 2 * q + (k & 1) + 8 * (k >> 1); }

}  // namespace fp4attn::paged
