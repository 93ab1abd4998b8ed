// FP8 GEMM operands of the emulated GPU backward (docs/numerics.md §8): power-of-two scales that
// put a slice's amax at the top of a format, and the roundings.
#pragma once

#include <vector>

namespace fp4attn::golden {

// E4M3 holds P and dS with the top at 2^8 (P's lift, headroom to 448); E5M2 holds dO with the
// top at 2^15 (max 57344 = 1.75 * 2^15), leaving it 31 binades down to 2^-16.
constexpr int kE4m3TopLog2 = 8;
constexpr int kE5m2TopLog2 = 15;

// e such that amax * 2^e lies in (2^(top - 1), 2^top]; 0 when amax is 0 or not finite.
int pow2_scale_exp(double amax, int top_log2);

// Largest |x| over x, NaN ignored (a NaN operand stays NaN through the rounding anyway).
double abs_max(const std::vector<double>& x);

// x * 2^e rounded to E4M3 / E5M2 (RNE, satfinite), as a value.
double e4m3_scaled(double x, int e);
double e5m2_scaled(double x, int e);

}  // namespace fp4attn::golden
