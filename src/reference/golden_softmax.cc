#include "reference/golden_softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "reference/golden_operands.h"

namespace fp4attn::golden {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Exp2 recipes lift P by 2^8 so the row maximum lands in (128, 256] (E4M3 max 448), FA3-style.
constexpr double kFp8PLift = 8;
// E4M3 code of 2^8 = 256: the top code of the exp-free map, 6 codes of headroom below NaN (127).
constexpr int kFastTopCode = 120;
// nvfp4-all: fixed global encode scale of P in (0, 1]: block scales amax/6 * 2688 <= 448.
constexpr float kNvfp4AllPScale = 448.f * 6.f;
// fp4-direct P blocks are folded with their exponent + 6 so the top block sits at 6 * 2^6 = 384.
constexpr int kDirectFoldShift = 6;

double nan_ignoring_max(const std::vector<double>& z, int64_t lo, int64_t hi) {
  double m = -std::numeric_limits<double>::infinity();
  bool any = false;
  for (int64_t j = lo; j < hi; ++j) {
    if (std::isnan(z[j])) continue;
    m = std::max(m, z[j]);
    any = true;
  }
  return any ? m : kNaN;
}

RowP bf16_p(const std::vector<double>& z, int64_t n) {
  RowP r;
  const double m = nan_ignoring_max(z, 0, n);
  r.p.resize(n);
  for (int64_t j = 0; j < n; ++j) {
    const double e = std::exp2(z[j] - m);
    r.p[j] = round_to_bf16(e);
    r.l += e;
  }
  r.lse_log2 = m + std::log2(r.l);
  return r;
}

RowP fp8_exp2_p(const std::vector<double>& z, int64_t n) {
  RowP r;
  const double m = integer_row_max(z, n);
  r.p.resize(n);
  for (int64_t j = 0; j < n; ++j) {
    const double e = std::exp2(z[j] - m + kFp8PLift);
    r.p[j] = round_to_e4m3(e);
    r.l += e;
  }
  r.lse_log2 = m - kFp8PLift + std::log2(r.l);
  return r;
}

RowP fast_p(const std::vector<double>& z, int64_t n) {
  RowP r;
  const double m = integer_row_max(z, n);
  r.p.resize(n);
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(z[j])) {
      r.p[j] = kNaN;
    } else {
      const double code =
          std::clamp(std::nearbyint(8 * (z[j] - m)) + kFastTopCode, 0.0, double(kFastTopCode));
      r.p[j] = e4m3_to_float(static_cast<uint8_t>(code));
    }
    r.l += r.p[j];  // the denominator sums the same rounded P
  }
  r.lse_log2 = m - kFp8PLift + std::log2(r.l);
  return r;
}

RowP nvfp4_all_p(const std::vector<double>& z, int64_t n, Emulation emu, double* param) {
  RowP r;
  const double m = integer_row_max(z, n);
  const bool fold = emu == Emulation::kFoldedE4M3;
  r.p.resize(n);
  float pf[kNvfp4Block];
  uint8_t codes[kNvfp4Block];
  for (int64_t j0 = 0; j0 < n; j0 += kNvfp4Block) {
    const int len = static_cast<int>(std::min<int64_t>(kNvfp4Block, n - j0));
    for (int i = 0; i < len; ++i) {
      const double e = std::exp2(z[j0 + i] - m);
      pf[i] = static_cast<float>(e);
      r.l += e;  // unrounded, as the hao-ai-lab kernel sums its row
    }
    const uint8_t sc =
        nvfp4_quantize_block(pf, len, kNvfp4AllPScale, Nvfp4ScaleRule::kNearest, codes);
    const double scale = e4m3_to_float(sc);
    for (int i = 0; i < len; ++i) {
      if (param != nullptr) param[j0 + i] = scale;
      const double prod = e2m1_to_float(codes[i]) * scale;
      r.p[j0 + i] = fold ? round_to_e4m3(prod / 8) : prod;
    }
  }
  r.p_unit = (fold ? 8.0 : 1.0) / kNvfp4AllPScale;
  r.lse_log2 = m + std::log2(r.l);
  return r;
}

RowP direct_p(const std::vector<double>& z, int64_t n, Emulation emu, double* param) {
  RowP r;
  const double m = integer_row_max(z, n);
  const bool fold = emu == Emulation::kFoldedE4M3;
  r.p.resize(n);
  for (int64_t j0 = 0; j0 < n; j0 += kDirectBlock) {
    const int64_t j1 = std::min<int64_t>(j0 + kDirectBlock, n);
    bool nan = false;
    for (int64_t j = j0; j < j1; ++j) nan |= std::isnan(z[j]);
    if (nan) {  // a NaN score makes its whole P block NaN, as a NaN scale would
      std::fill(r.p.begin() + j0, r.p.begin() + j1, kNaN);
      r.l = kNaN;
      continue;
    }
    // Block exponent from the block max relative to the row reference; E8M0 byte 0 zeroes it.
    const double g = nan_ignoring_max(z, j0, j1) - m;
    const int e = g < -1000 ? -1000 : direct_block_exponent(static_cast<float>(g));
    const bool zero_block = e + 127 <= 0;
    double c = 0;  // sum of the block's E2M1 values
    for (int64_t j = j0; j < j1; ++j) {
      if (param != nullptr) param[j] = zero_block ? -1000 : e;
      double q = 0;
      if (!zero_block) {
        const float x = static_cast<float>((z[j] - m) - e + kLog2Six);
        q = e2m1_to_float(direct_p_code(x, kDirectA, kDirectB));
      }
      c += q;
      r.p[j] = fold ? round_to_e4m3(std::ldexp(q, e + kDirectFoldShift)) : std::ldexp(q, e);
    }
    // alpha * (c / 6), never (alpha / 6) * c (the paper's subnormal pitfall).
    if (!zero_block) r.l += std::ldexp(1.0, e) * (c / 6);
  }
  r.p_unit = (fold ? std::ldexp(1.0, -kDirectFoldShift) : 1.0) / 6;
  r.lse_log2 = m + std::log2(r.l);
  return r;
}

}  // namespace

double integer_row_max(const std::vector<double>& z, int64_t n) {
  return std::ceil(nan_ignoring_max(z, 0, n));
}

RowP make_row_p(const std::vector<double>& z, int64_t n, const RecipeOptions& opt,
                std::vector<double>* block_param) {
  double* param = nullptr;
  if (block_param != nullptr) {
    block_param->assign(n, 0.0);
    param = block_param->data();
  }
  RowP r;
  if (recipe_p_is_codes(opt.recipe)) {
    r = fast_p(z, n);
  } else {
    switch (opt.recipe) {
      case Recipe::kBf16:
        r = bf16_p(z, n);
        break;
      case Recipe::kNvfp4All:
        r = nvfp4_all_p(z, n, opt.emulation, param);
        break;
      case Recipe::kFp4Direct:
        r = direct_p(z, n, opt.emulation, param);
        break;
      default:
        r = fp8_exp2_p(z, n);
        break;
    }
  }
  for (double p : r.p) r.zeros += (p == 0);
  return r;
}

}  // namespace fp4attn::golden
