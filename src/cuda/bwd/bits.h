// Host/device helpers of the GPU backward with host twins tested on the CPU
// (tests/reference/test_bwd_bits.cc): the gradient scales' exponents, exact power-of-two
// scaling, the causal query range of a key block and the query order of the transposed operands.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/operands.h"

namespace fp4attn::bwd {

// The period of the transposed operands' query permutation (transposed_position_of_query) and
// prep_quant's block of queries.
constexpr int kPrepQueries = 32;
// The main kernel's tiles (main_kernel.cuh): a key block of 128 keys per CTA (64 per consumer
// warpgroup), a query block of 64 queries per step.
constexpr int kKeyBlock = 128;
constexpr int kQueryBlock = 64;
// The workspace's query padding (do_v, do_t, q_t, dq_turn): whole query blocks of the main kernel
// and of prep_quant.
constexpr int kQueryPad = 64;
// Tops of the FP8 ranges (numerics.md §8; golden_backward_fp8.h kE4m3TopLog2 / kE5m2TopLog2).
constexpr int kE4m3Top = 8;
constexpr int kE5m2Top = 15;
constexpr int kPLiftLog2 = 8;  // the P operand is E4M3(2^8 p)

// Slots of the per-(batch, head) amax record of dO (prep_rows). The record keeps 4 slots (2 and 3
// unused): its stride, on which the kernels' addressing and the workspace size rest.
enum AmaxSlot { kAmaxDo = 0, kAmaxDoFv = 1, kAmaxSlots = 4 };

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

// mul_pow2(x, e) for a fixed e, bit for bit, without branches: (x * f1) * f2 with f2 = 1 unless
// e is outside [-126, 127] (CPU test BwdBits.Pow2IsMulPow2).
struct Pow2 {
  float f1, f2;
  FP4ATTN_HD explicit Pow2(int e) {
    e = e < -252 ? -252 : e > 254 ? 254 : e;
    f1 = exp2i(e > 127 ? 127 : e < -126 ? -126 : e);
    f2 = exp2i(e > 127 ? e - 127 : e < -126 ? e + 126 : 0);
  }
  FP4ATTN_HD float operator()(float x) const { return (x * f1) * f2; }
  // f2 = 1: x * f1 alone is the same value (the multiply by 1 is exact).
  FP4ATTN_HD bool single() const { return f2 == 1.f; }
  template <bool kSingle>
  FP4ATTN_HD float apply(float x) const {
    return kSingle ? x * f1 : (x * f1) * f2;
  }
};

// First query (inclusive) that sees any key of the block starting at key n0: bottom-right causal
// (key j visible to query i iff j <= i + s_k - s_q), rounded down to a query block of `block`.
FP4ATTN_HD int64_t first_query_block(int64_t n0, int64_t s_q, int64_t s_k, bool causal,
                                     int64_t block) {
  if (!causal) return 0;
  const int64_t i = n0 - (s_k - s_q);
  return i <= 0 ? 0 : i / block;
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

// Workspace padding of the transposed operands: whole query blocks (kQueryPad).
FP4ATTN_HD int64_t padded_queries(int64_t s_q) {
  return (s_q + kQueryPad - 1) / kQueryPad * kQueryPad;
}

// The FP32 accumulator of an m64nN wgmma tile gives thread t (lane % 4) element e: row g + 8 *
// accum_row_half(e) of its warp's 16 (g = lane / 4), column accum_col(e, t).
FP4ATTN_HD constexpr int accum_col(int e, int t) { return 8 * (e >> 2) + 2 * t + (e & 1); }
FP4ATTN_HD constexpr int accum_row_half(int e) { return (e >> 1) & 1; }
// The FP8 A operand (k = 32 per step) of the same rows, made from the accumulator without
// shuffles: byte b of register r of k-step kk is element 16 kk + a_source_element(r, b); the
// A layout puts there row g + 8 (r % 2), k position 32 kk + 16 (r / 2) + 4 t + b. Against B
// operands stored in the permuted query order above, that k position holds the element's own
// query (CPU test BwdBits.AFragmentsMatchTheirQueries).
FP4ATTN_HD constexpr int a_source_element(int r, int b) {
  return 8 * (r >> 1) + 2 * (r & 1) + (b & 1) + 4 * (b >> 1);
}
FP4ATTN_HD constexpr int a_k_position(int kk, int r, int b, int t) {
  return 32 * kk + 16 * (r >> 1) + 4 * t + b;
}

// The D_hp row sums (main_dhp.cuh add_d_hp): a thread's 16 column partial sums, index
// k for column accum_col(d_hp_element(k), t) (row half 0; element + 2 is row half 1 of the same
// column). Three halving steps over lane bits 4, 3, 2 (g's bits 2, 1, 0), a lane keeping the
// upper half when its bit is set, leave lane (g, t) indices 2g and 2g + 1: columns d_hp_col(g, t,
// b). CPU test BwdBits.DHpReduceScatterSumsEveryColumn.
FP4ATTN_HD constexpr int d_hp_element(int k) { return 4 * (k >> 1) + (k & 1); }
FP4ATTN_HD constexpr int d_hp_col(int g, int t, int b) { return 8 * g + 2 * t + b; }

}  // namespace fp4attn::bwd
