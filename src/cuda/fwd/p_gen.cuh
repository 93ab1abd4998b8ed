// How the forward engine makes P from a block of raw scores S (per-thread registers of the
// 64 x N wgmma accumulator), one function per P mode (p_mode.h), and how P is packed into the PV
// GEMM's A operand.
// z = S * c (c: the score factor of the key's 128-key tile), m: the row's integer log2 running
// max (numerics.md §4), so every rescale of O and of the sums is an exact power of two.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cuda/fwd/config.h"
#include "cuda/fwd/p_mode.h"
#include "cuda/sm90/ptx.cuh"
#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/fast_div.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn::sm90 {

// log2 of what P's operand units are worth relative to the row max: P = 2^(z - m + 8) for exp2
// and the code map (top code 120 = 2^8); fp4-direct's operand is q * 2^(e + 6) for a
// probability 2^e * q / 6. The LSE is m - lift + log2(sum of the operand values).
// nvfp4-all's operand is e2m1 * scale / 8 for a probability e2m1 * scale / 2688 (log2 336).
constexpr float kAllPScale = 2688.f;  // 448 * 6: block scales amax / 6 * 2688 <= 448 for P <= 1
static_assert(kAllPScale == 2688.f && kE2m1Max == 6.f, "fast_div.h's quotients are by 6 and 2688");
template <int PM>
__host__ __device__ constexpr float p_lift_log2() {
  return PM == kPDirect ? 6.f + kLog2Six : PM == kPAll ? 8.392317422778761f : 8.f;
}
constexpr float kPLift = p_lift_log2<kPExp2>();

// Per-thread view of a 64 x N FP32 wgmma accumulator: register i holds row
// r0 + 8 * ((i >> 1) & 1) and column 8 * (i >> 2) + 2 * t + (i & 1) (t = lane % 4).
struct Frag {
  __device__ __forceinline__ static int col(int i, int t) { return 8 * (i >> 2) + 2 * t + (i & 1); }
  __device__ __forceinline__ static int half(int i) { return (i >> 1) & 1; }
  // Which 128-key scale tile of the block register i belongs to.
  __device__ __forceinline__ static int tile(int i) { return i / (kScaleTile / 2); }
};

// Softmax state of the two rows a thread holds.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // integer log2 running max
  float l[2] = {0.f, 0.f};              // this thread's share of the unrounded P sums
};

struct Mask {
  int s_k, causal_offset;
  bool causal;
  __device__ __forceinline__ bool visible(int key, int row) const {
    return key < s_k && (!causal || key <= row + causal_offset);
  }
};

// Keys outside the causal band or past s_k (`edge` blocks only) -> -inf.
template <int SN>
__device__ __forceinline__ void mask_scores(float (&s)[SN], bool edge, int n0, int t,
                                            const int (&rows)[2], const Mask& mask) {
  if (!edge) return;
#pragma unroll
  for (int i = 0; i < SN; ++i) {
    if (!mask.visible(n0 + Frag::col(i, t), rows[Frag::half(i)])) s[i] = -INFINITY;
  }
}

// One row's running-max update from the block's largest z over the quad (mx).
__device__ __forceinline__ void row_max_step(float mx, RowState& st, int h2, float (&m_use)[2],
                                             float (&alpha)[2]) {
  const float m_new = fmaxf(st.m[h2], ceilf(mx));
  m_use[h2] = m_new == -INFINITY ? 0.f : m_new;
  alpha[h2] = fast_exp2(st.m[h2] - m_use[h2]);  // exact power of two (0 from -inf)
  st.m[h2] = m_new;
}

// The block's update of the integer log2 running max (NaN-ignoring, as the golden model): m_use
// is the new max (0 for a row without a valid key so far, so that later arithmetic sees -inf,
// not NaN) and alpha = 2^(m_old - m_new), the exact factor by which O and the sums are scaled.
template <int SN>
__device__ __forceinline__ void update_row_max(const float (&s)[SN], RowState& st,
                                               const float (&c)[2], float (&m_use)[2],
                                               float (&alpha)[2]) {
  // Partial maxima per row and scale tile (two each: short dependency chains); max(S) * c =
  // max(S * c) for c >= 0, and a NaN product (c = 0 on masked keys, a NaN tile) is ignored.
  float mp[2][2][2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
#pragma unroll
    for (int g = 0; g < 4; ++g) mp[h2][g / 2][g % 2] = -INFINITY;
  }
#pragma unroll
  for (int i = 0; i < SN; ++i) {
    float& m = mp[Frag::half(i)][Frag::tile(i)][(i >> 2) & 1];
    m = fmaxf(m, s[i]);
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float mx =
        fmaxf(fmaxf(mp[h2][0][0], mp[h2][0][1]) * c[0], fmaxf(mp[h2][1][0], mp[h2][1][1]) * c[1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    row_max_step(mx, st, h2, m_use, alpha);
  }
}

// S (raw Q K^T sums) -> P = 2^(S * c + 8 - m) in place, with c the score factor of each
// 128-key tile, m the integer log2 running max (NaN-ignoring, as the golden model), and the
// unrounded row sums; returns the factors 2^(m_old - m_new) by which O must be scaled. Keys
// outside the causal band or past s_k (`edge` blocks only) get P = 0.
template <bool kOnes, int SN>
__device__ __forceinline__ void softmax_block(float (&s)[SN], RowState& st, const float (&c)[2],
                                              bool edge, int n0, int t, const int (&rows)[2],
                                              const Mask& mask, float (&alpha)[2]) {
  mask_scores(s, edge, n0, t, rows, mask);
  float m_use[2];
  update_row_max(s, st, c, m_use, alpha);
  const float bias[2] = {kPLift - m_use[0], kPLift - m_use[1]};
  // Four partial sums per row (the order of an FP32 sum is free: the golden denominator is
  // exact). With kOnes the PV MMA sums P instead.
  float sp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  if (edge) {  // masked keys give exactly 0, even where c is 0 or NaN (-inf * c is NaN then)
#pragma unroll
    for (int i = 0; i < SN; ++i) {
      const float e = fast_exp2(fmaf(s[i], c[Frag::tile(i)], bias[Frag::half(i)]));
      s[i] = mask.visible(n0 + Frag::col(i, t), rows[Frag::half(i)]) ? e : 0.f;
      if constexpr (!kOnes) sp[Frag::half(i)][(i >> 2) & 3] += s[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < SN; ++i) {
      s[i] = fast_exp2(fmaf(s[i], c[Frag::tile(i)], bias[Frag::half(i)]));
      if constexpr (!kOnes) sp[Frag::half(i)][(i >> 2) & 3] += s[i];
    }
  }
  if constexpr (!kOnes) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const float rs = (sp[h2][0] + sp[h2][1]) + (sp[h2][2] + sp[h2][3]);
      st.l[h2] = fmaf(st.l[h2], alpha[h2], rs);
    }
  }
}

// P (FP32) -> E4M3 A-operand registers: register kk*4 + {0,1,2,3} = rows {r0, r0+8, r0, r0+8}
// x key positions {4t..4t+3, 16+4t..16+4t+3} of the 32-key step kk; the V^T operand stores
// keys in the matching order (operand_v_key_at in operands.h).
template <int SN>
__device__ __forceinline__ void pack_p(const float (&s)[SN], uint32_t (&pa)[SN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < SN / 16; ++kk) {
    const float* g = s + 16 * kk;
    pa[kk][0] = pack_e4m3x4(g[0], g[1], g[4], g[5]);
    pa[kk][1] = pack_e4m3x4(g[2], g[3], g[6], g[7]);
    pa[kk][2] = pack_e4m3x4(g[8], g[9], g[12], g[13]);
    pa[kk][3] = pack_e4m3x4(g[10], g[11], g[14], g[15]);
  }
}

// nvfp4-fast, fp8-fast: P as E4M3 codes without exp2 (numerics.md §4): code = clamp(RNE(8 (z - m))
// + 120, 0, 120) with m the integer log2 running max (so z - m <= 0 and no upper clamp is needed).
// One FFMA lands RNE(8 z - 8 m + 120) in the low mantissa bits of a float near 1.5 * 2^23 (the FMA
// computes S * 8c exactly before its one rounding); one FMNMX.NAN clamps at code 0 and keeps a NaN
// (a NaN score, or a NaN tile factor from a NaN input block), whose low byte 0xFF is the E4M3
// NaN, as the golden model's NaN P. The codes stay in the low bytes of s for pack().
template <int SN>
__device__ __forceinline__ void softmax_codes(float (&s)[SN], RowState& st, const float (&c)[2],
                                              bool edge, int n0, int t, const int (&rows)[2],
                                              const Mask& mask, float (&alpha)[2]) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: integers in the low mantissa bits
  mask_scores(s, edge, n0, t, rows, mask);
  float m_use[2];
  update_row_max(s, st, c, m_use, alpha);
  const float bias[2] = {kMagic + 120.f - 8.f * m_use[0], kMagic + 120.f - 8.f * m_use[1]};
  // A zero tile factor (an all-zero Q or K tile) as the smallest normal float: visible keys
  // still get S * 8c + bias = bias exactly, and masked ones -inf, not -inf * 0 = NaN.
  const float c8[2] = {c[0] == 0.f ? FLT_MIN : 8.f * c[0], c[1] == 0.f ? FLT_MIN : 8.f * c[1]};
#pragma unroll
  for (int i = 0; i < SN; ++i) {
    s[i] = fmax_nan(fmaf(s[i], c8[Frag::tile(i)], bias[Frag::half(i)]), kMagic);
  }
}

// Codes (low byte of each s) -> A-operand registers, in pack_p's order.
template <int SN>
__device__ __forceinline__ void pack_codes(const float (&s)[SN], uint32_t (&pa)[SN / 16][4]) {
  auto quad = [](float a, float b, float c, float d) {
    const uint32_t lo = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x0040);
    const uint32_t hi = __byte_perm(__float_as_uint(c), __float_as_uint(d), 0x0040);
    return __byte_perm(lo, hi, 0x5410);
  };
#pragma unroll
  for (int kk = 0; kk < SN / 16; ++kk) {
    const float* g = s + 16 * kk;
    pa[kk][0] = quad(g[0], g[1], g[4], g[5]);
    pa[kk][1] = quad(g[2], g[3], g[6], g[7]);
    pa[kk][2] = quad(g[8], g[9], g[12], g[13]);
    pa[kk][3] = quad(g[10], g[11], g[14], g[15]);
  }
}

// E2M1 round-to-nearest-even of u >= 0, satfinite at 6, as float_to_e2m1 (formats.h): the grid
// step is 0.5 below 2, 1 below 4 and 2 above, so adding and subtracting 1.5 * 2^(22, 23, 24)
// rounds to it with ties to the even code (0, 1, 2, 4 are the even codes' values).
__device__ __forceinline__ float e2m1_rne(float u) {
  const float magic = u < 2.f ? 6291456.f : (u < 4.f ? 12582912.f : 25165824.f);
  return fminf(__fsub_rn(__fadd_rn(u, magic), magic), 6.f);
}

// Per block row of fp4-direct: the block scale and u / 8 = (A x + B) / 8 = (A c / 8) S + (A (log2 6
// - e - m) + B) / 8 as one FFMA.SAT per key (ac8, k08), which also clamps at 0 and 8 and zeroes NaN
// (-inf * 0 on masked keys, a NaN S). g NaN (c NaN) or -inf (no visible key): a zero block.
// Codes in eighths: the unit is 8 * 2^(e + 6).
struct DirectRow {
  DirectBlockScale sc;
  float k08;
};
__device__ __forceinline__ DirectRow direct_row(float bm, float cb, float m_use) {
  const DirectBlockScale sc = direct_block_scale(bm * cb - m_use, 9);
  return {sc, fmaf(kDirectA / 8, kLog2Six - sc.e - m_use, kDirectB / 8)};
}

// The rare pass for rows with |m| > 2^20 (direct_cap_free false somewhere in the warp): s <-
// min(w, 3/4), w = u / 8 clamped, so that the main pass (then with ac8 = 1, k08 = 0: FFMA.SAT(w,
// 1, 0) = w) needs no clamp at 6 per key.
template <int SN>
__device__ __forceinline__ void direct_precap(float (&s)[SN], const float (&bm)[SN / 16][2],
                                              const float (&c)[2], const float (&m_use)[2]) {
#pragma unroll
  for (int b = 0; b < SN / 16; ++b) {
    const float cb = c[Frag::tile(16 * b)];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const float k08 = direct_row(bm[b][h2], cb, m_use[h2]).k08;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float& x = s[16 * b + 4 * j + 2 * h2 + k];
          x = fminf(fma_sat(x, (kDirectA / 8) * cb, k08), 0.75f);
        }
      }
    }
  }
}

// fp4-direct's operands and block-row sums from the quad's block maxima bm (softmax_direct);
// precapped: s holds min(w, 3/4) already (direct_precap).
template <int SN>
__device__ __forceinline__ void direct_operands(float (&s)[SN], const float (&bm)[SN / 16][2],
                                                const float (&c)[2], const float (&m_use)[2],
                                                bool precapped, float (&lsum)[2]) {
#pragma unroll
  for (int b = 0; b < SN / 16; ++b) {
    const float cb = c[Frag::tile(16 * b)];
    const float ac8 = precapped ? 1.f : (kDirectA / 8) * cb;  // = (A c) / 8 exactly
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const DirectRow row = direct_row(bm[b][h2], cb, m_use[h2]);
      const DirectKeyMap km = direct_key_map(row.sc);
      const float k08 = precapped ? 0.f : row.k08;
      float psum = 0.f;  // = unit * sum(q / 8), exactly: every term is a multiple of unit / 16
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float& x = s[16 * b + 4 * j + 2 * h2 + k];
          x = direct_operand<false>(fma_sat(x, ac8, k08), km);  // q * 2^(e + 6)
          psum += x;
        }
      }
      lsum[h2] += psum;
    }
  }
}

// A NaN score factor (a NaN in the tile's Q or K block, rare) makes the visible P of the tile's
// keys and the rows' sums NaN (numerics.md §2: the NaN reaches the outputs that read the block).
template <int SN>
__device__ __forceinline__ void propagate_nan_tiles(float (&s)[SN], RowState& st,
                                                    const float (&c)[2], bool edge, int n0, int t,
                                                    const int (&rows)[2], const Mask& mask) {
  if (c[0] != c[0] || c[1] != c[1]) {  // rare: a NaN input block
#pragma unroll
    for (int i = 0; i < SN; ++i) {
      const bool visible = !edge || mask.visible(n0 + Frag::col(i, t), rows[Frag::half(i)]);
      if (c[Frag::tile(i)] != c[Frag::tile(i)] && visible) {
        s[i] = NAN;
        st.l[Frag::half(i)] = NAN;
      }
    }
  }
}

// fp4-direct (numerics.md §5): per 32-key block B and row, e = floor(g + 1 - log2 1.5) with g
// the block's largest z - m (a quad of lanes holds the block's 32 keys: two shuffles), the code
// q = E2M1_RNE(max(0, A x + B)) of x = z - m - e + log2 6, and the operand value q * 2^(e + 6)
// (exact in E4M3 for blocks within 14 binades of the row max; beyond, F2FP rounds as the golden
// model's fold). A block with e + 127 <= 0 is zero. The row sums add 2^(e + 6) * sum(q), exactly
// the operand values, so O / l and the LSE (p_lift_log2) need no other factor. With the running
// max, e moves with m and x does not: the codes equal the golden model's (final max) ones except
// for blocks that only the final max pushes past the zero or folding limits (2^-14 of the max).
// A NaN tile factor makes the tile's visible P NaN and the row sum NaN, a NaN score (the block
// maxima keep it) the row sum NaN: either way the row's O and LSE are NaN, as the golden model's.
//
// Lean form (issue 6), bit-identical to the previous one (tests/reference/test_direct_fast.cc):
// the row max comes from the quad's block maxima (max(S) c = max(S c) for c >= 0, NaN products
// ignored either way; at most the sign of a zero m differs, which changes no result), so S is
// scanned once. Per key one FFMA.SAT gives w = clamp(u, 0, 8) / 8 and direct_operand rounds it to
// E2M1 and scales it by the unit in 4 instructions, no compares or selects (the magic number
// carries the unit); the block-row sum of the operand values is exactly the previous
// unit * sum(q). The clamp at 6 is needed only for rows with |m| > 2^20 (one vote per block). The
// block exponent and unit come from direct_block_scale (no float <-> int conversions).
template <int SN>
__device__ __forceinline__ void softmax_direct(float (&s)[SN], RowState& st, const float (&c)[2],
                                               bool edge, int n0, int t, const int (&rows)[2],
                                               const Mask& mask, float (&alpha)[2]) {
  static_assert(kDirectBlock == 32, "a 32-key block is 16 registers of a thread");
  constexpr int kBlocks = SN / 16;
  mask_scores(s, edge, n0, t, rows, mask);
  // Raw S maxima per block and row over the quad: registers 16b + 4j + 2 h2 + {0, 1}.
  float bm[kBlocks][2];
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const float* r = s + 16 * b + 2 * h2;
      float m = fmax_nan(fmax_nan(fmax_nan(r[0], r[1]), fmax_nan(r[4], r[5])),
                         fmax_nan(fmax_nan(r[8], r[9]), fmax_nan(r[12], r[13])));
      m = fmax_nan(m, __shfl_xor_sync(0xffffffff, m, 1));
      bm[b][h2] = fmax_nan(m, __shfl_xor_sync(0xffffffff, m, 2));
    }
  }
  constexpr int kTiles = (SN + kScaleTile / 2 - 1) / (kScaleTile / 2);
  float m_use[2];
  bool nan_row[2];  // a NaN score in the row's keys of this block
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float mt[kTiles];  // per 128-key scale tile that the block has
#pragma unroll
    for (int k = 0; k < kTiles; ++k) mt[k] = -INFINITY;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
      mt[Frag::tile(16 * b)] = fmax_nan(mt[Frag::tile(16 * b)], bm[b][h2]);
    float raw = mt[0];
#pragma unroll
    for (int k = 1; k < kTiles; ++k) raw = fmax_nan(raw, mt[k]);
    nan_row[h2] = raw != raw;
    // A tile the block lacks gave -inf * c (-inf or NaN), a NaN tile max a NaN product: the
    // fmaxf here and in row_max_step ignore both (the row is NaN then, whatever m is).
    float mx = mt[0] * c[0];
#pragma unroll
    for (int k = 1; k < kTiles; ++k) mx = fmaxf(mx, mt[k] * c[k]);
    row_max_step(mx, st, h2, m_use, alpha);
  }
  float lsum[2] = {0.f, 0.f};
  // The clamp at 6 only matters for rows with |m| > 2^20 (direct_cap_free): a vote per block
  // runs the clamping pass for the whole warp only then.
  const bool precap =
      !__all_sync(0xffffffff, direct_cap_free(m_use[0]) && direct_cap_free(m_use[1]));
  if (precap) direct_precap(s, bm, c, m_use);
  direct_operands(s, bm, c, m_use, precap, lsum);
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    // A NaN score: FFMA.SAT made its P 0, so the row's sum carries the NaN (and so O and the
    // LSE); the golden model's P of that block is NaN.
    st.l[h2] = nan_row[h2] ? NAN : fmaf(st.l[h2], alpha[h2], lsum[h2]);
  }
  propagate_nan_tiles(s, st, c, edge, n0, t, rows, mask);
}

// nvfp4-all (the all-FP4 recipe, numerics.md §4): p = 2^(z - m) <= 1 quantized per 16-key block
// exactly as nvfp4_quantize_block (nearest rule) with the fixed global scale 2688: block amax over
// the quad's 4 x 4 values (two shuffles), scale = E4M3((amax / 6) * 2688), codes E2M1(p *
// (2688 / scale)), operand value code * scale / 8 (F2FP rounds it as the golden model's fold).
// The row sums are the unrounded p (the golden denominator), kept in operand units (x 336).
template <int SN>
__device__ __forceinline__ void softmax_all(float (&s)[SN], RowState& st, const float (&c)[2],
                                            bool edge, int n0, int t, const int (&rows)[2],
                                            const Mask& mask, float (&alpha)[2]) {
  mask_scores(s, edge, n0, t, rows, mask);
  float m_use[2];
  update_row_max(s, st, c, m_use, alpha);
  float sp[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < SN; ++i) {
    const float e = fast_exp2(fmaf(s[i], c[Frag::tile(i)], -m_use[Frag::half(i)]));
    s[i] = !edge || mask.visible(n0 + Frag::col(i, t), rows[Frag::half(i)]) ? e : 0.f;
    sp[Frag::half(i)] += s[i];
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    st.l[h2] = fmaf(st.l[h2], alpha[h2], sp[h2] * (kAllPScale / 8.f));
  }
#pragma unroll
  for (int b = 0; b < SN / 8; ++b) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      // Registers 8b + 2 h2 + {0, 1, 4, 5}: this thread's 4 keys of the 16-key block's row.
      const int r[4] = {8 * b + 2 * h2, 8 * b + 2 * h2 + 1, 8 * b + 2 * h2 + 4, 8 * b + 2 * h2 + 5};
      float amax = fmaxf(fmaxf(s[r[0]], s[r[1]]), fmaxf(s[r[2]], s[r[3]]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 2));
      // div6_rn and div_2688_by_e4m3_rn: the same bits as the two IEEE divisions (fast_div.h).
      const float sf = detail::mul_rn(div6_rn(amax), kAllPScale);
      const float f = e4m3_to_float(float_to_e4m3(sf));
      const float inv = f == 0.f ? 0.f : div_2688_by_e4m3_rn(f);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s[r[k]] = e2m1_rne(detail::mul_rn(s[r[k]], inv)) * f * 0.125f;  // exact product
      }
    }
  }
  propagate_nan_tiles(s, st, c, edge, n0, t, rows, mask);
}

template <int PM, bool kOnes, int SN>
__device__ __forceinline__ void p_values(float (&s)[SN], RowState& st, const float (&c)[2],
                                         bool edge, int n0, int t, const int (&rows)[2],
                                         const Mask& mask, float (&alpha)[2]) {
  if constexpr (PM == kPConstant) {
    (void)c, (void)edge, (void)n0, (void)t, (void)rows, (void)mask;
    // S must stay live: ptxas drops a wgmma whose outputs are dead, and the bound then measures
    // PV alone. One select on s[0] keeps the chain of S wgmmas.
    const float p_const = 1.f;
    const bool never = __float_as_uint(s[0]) == 0x7FC00001u;
#pragma unroll
    for (int i = 0; i < SN; ++i) s[i] = p_const;
    s[0] = never ? 0.f : p_const;
    st.m[0] = st.m[1] = 0.f;
    st.l[0] = st.l[1] = 1.f;
    alpha[0] = alpha[1] = 1.f;
  } else if constexpr (PM == kPCodes) {
    softmax_codes(s, st, c, edge, n0, t, rows, mask, alpha);
  } else if constexpr (PM == kPDirect) {
    softmax_direct(s, st, c, edge, n0, t, rows, mask, alpha);
  } else if constexpr (PM == kPAll) {
    softmax_all(s, st, c, edge, n0, t, rows, mask, alpha);
  } else {
    softmax_block<kOnes>(s, st, c, edge, n0, t, rows, mask, alpha);
  }
}

template <int PM, int SN>
__device__ __forceinline__ void pack(const float (&s)[SN], uint32_t (&pa)[SN / 16][4]) {
  if constexpr (PM == kPCodes) {
    pack_codes(s, pa);
  } else {
    pack_p(s, pa);
  }
}

}  // namespace fp4attn::sm90
