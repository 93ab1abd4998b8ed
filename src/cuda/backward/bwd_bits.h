// Host/device helpers of the GPU backward with host twins tested on the CPU
// (tests/reference/test_bwd_bits.cc): the gradient scales' exponents, exact power-of-two
// scaling, the causal query range of a key block and the query order of the transposed operands.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/config.h"
#include "fp4attn/operands.h"

namespace fp4attn::bwd {

constexpr int kBlockKeys = 64;     // keys per CTA (one K/V block)
constexpr int kBlockQueries = 32;  // queries per step of the CTA's loop
// Tops of the FP8 ranges (numerics.md §8; golden_backward_fp8.h kE4m3TopLog2 / kE5m2TopLog2).
constexpr int kE4m3Top = 8;
constexpr int kE5m2Top = 15;
constexpr int kPLiftLog2 = 8;  // the P operand is E4M3(2^8 p)

// Slots of the per-(batch, head) amax record.
enum AmaxSlot { kAmaxDo = 0, kAmaxDoFv = 1, kAmaxDsK = 2, kAmaxDsQ = 3, kAmaxSlots = 4 };

// ceil(log2 x) of a positive finite float, from its bits (exact, no library call).
FP4ATTN_HD int ceil_log2_bits(float x) {
  union {
    float f;
    uint32_t u;
  } v{x};
  const int e = int(v.u >> 23), m = int(v.u & 0x7FFFFFu);
  if (e == 0) {  // subnormal: m * 2^-149
    int top = 31;
    while (!((uint32_t(m) >> top) & 1u)) --top;
    return top - 149 + ((m & (m - 1)) != 0 ? 1 : 0);
  }
  return e - 127 + (m != 0 ? 1 : 0);
}

// e such that amax * 2^e lies in (2^(top - 1), 2^top]; 0 when amax is 0 or not finite: the
// FP32 twin of golden::pow2_scale_exp.
FP4ATTN_HD int pow2_scale_exp(float amax, int top) {
  if (!(amax > 0.f) || !(amax <= 3.402823466e38f)) return 0;
  return top - ceil_log2_bits(amax);
}

// 2^e as a float for e in [-126, 127].
FP4ATTN_HD float exp2i(int e) {
  union {
    uint32_t u;
    float f;
  } v{static_cast<uint32_t>(e + 127) << 23};
  return v.f;
}

// x * 2^e. For e in [-126, 127] one rounding (exact unless the result is subnormal or
// overflows): the same value as rounding the exact x * 2^e to FP32, which the golden model does.
// Outside, two factors (e clamped to [-252, 254]; only tiny or huge slices get there).
FP4ATTN_HD float mul_pow2(float x, int e) {
  e = e < -252 ? -252 : e > 254 ? 254 : e;
  if (e > 127) return (x * exp2i(127)) * exp2i(e - 127);
  if (e < -126) return (x * exp2i(-126)) * exp2i(e + 126);
  return x * exp2i(e);
}

// First query (inclusive) that sees any key of the block starting at key n0: bottom-right causal
// (key j visible to query i iff j <= i + s_k - s_q), rounded down to a query block.
FP4ATTN_HD int64_t first_query_block(int64_t n0, int64_t s_q, int64_t s_k, bool causal) {
  if (!causal) return 0;
  const int64_t i = n0 - (s_k - s_q);
  return i <= 0 ? 0 : i / kBlockQueries;
}

FP4ATTN_HD bool key_visible(int64_t i, int64_t j, int64_t s_q, int64_t s_k, bool causal) {
  return i < s_q && j < s_k && (!causal || j <= i + s_k - s_q);
}

// Transposed dO and Q ([d][queries], queries contiguous) keep the queries of each 16-group in the
// order of the forward's V operand (operands.h operand_v_key_at): column position p of a block
// holds query operand_v_key_at(p). Then the FP32 accumulator fragment of S^T (queries 2t, 2t+1,
// 2t+8, 2t+9 of each 16 in thread t) is, byte for byte, the mma A fragment over positions
// 4t..4t+3, and P^T / dS^T need no shuffle.
FP4ATTN_HD int64_t transposed_position_of_query(int64_t query) {
  return operand_v_position_of(query);
}

// Workspace padding of the transposed operands: whole query blocks.
FP4ATTN_HD int64_t padded_queries(int64_t s_q) {
  return (s_q + kBlockQueries - 1) / kBlockQueries * kBlockQueries;
}

}  // namespace fp4attn::bwd
