// Operand preparation of the golden model: for one (batch, head) slice, the values the tensor
// core multiplies and the factors that turn their products back into real units.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/golden/golden.h"

namespace fp4attn::golden {

// Tokens per FP32 scale of the fp8 recipe's Q and K (one scale for all of head_dim).
constexpr int64_t kFp8QkBlockTokens = 128;

// A dense row-major [rows, cols] matrix of one head (tokens x head_dim).
struct HeadMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> x;
  float at(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

// One (batch, head) of a BSHD tensor [b, s, h, d] as a dense [tokens, d] FP32 matrix.
HeadMatrix gather_head(const TensorView& t, int64_t b, int64_t h);

// Subtracts the per-channel key mean, rounded to BF16 (a value the GPU reproduces exactly: the
// sum is taken in double), and returns the mean.
std::vector<double> smooth_keys(HeadMatrix* k);
// smooth_keys where the recipe and its options smooth K (k_is_smoothed), else an empty mean.
std::vector<double> smooth_keys_as(HeadMatrix* k, const RecipeOptions& opt);

// Values the MMA consumes (E4M3 / BF16 values, or exact block-scaled products), row-major like
// the source matrix, plus a factor per row (Q and K: per token) or per column (V: per channel).
struct Operand {
  int64_t rows = 0, cols = 0;
  std::vector<double> val;
  std::vector<double> factor;
};

// Q or K of one head, quantized along head_dim as the recipe says. `tensor_scale` is the static
// NVFP4 s_enc or 0 to compute it from this slice.
Operand prepare_qk(const HeadMatrix& m, Recipe recipe, Emulation emu, float tensor_scale);

// V of one head [tokens, head_dim], quantized along tokens (the PV contraction): per-channel
// FP8 scales, or FP4 blocks along tokens; factor is per channel.
Operand prepare_v(const HeadMatrix& m, Recipe recipe, Emulation emu, float tensor_scale);

// The log2-domain scores of query row i against keys 0..n-1: z_j = (q_i . k_j) * q factor * k
// factor * zscale (zscale = softmax scale * log2 e), summed over channels in order; the forward
// and the backward form them alike, so that the backward rebuilds the forward's P bit for bit.
void row_scores(const Operand& qo, const Operand& ko, int64_t i, int64_t n, double zscale,
                std::vector<double>* z);

// q_i . kmean (the FP32 query against the smoothed keys' mean): K smoothing shifts the LSE by
// scale times this, and leaves the softmax unchanged.
double q_dot_mean(const HeadMatrix& q, int64_t i, const std::vector<double>& kmean);

// Per row of the row-major [rows, cols] matrix `val`: 1 when all of its values are finite. The PV
// loops skip a key whose P is exactly 0 only when its V row is finite, so that 0 * inf gives NaN
// as in float64 (numerics.md §4, "NaN"); one pass over V per head, not per query row.
std::vector<char> finite_rows(const std::vector<double>& val, int64_t rows, int64_t cols);

// E4M3 value of x (round to nearest even, satfinite): what folding a scale into FP8 does.
double round_to_e4m3(double x);
// BF16 value of x (round to nearest even).
double round_to_bf16(double x);

}  // namespace fp4attn::golden
