#include "reference/golden_operands.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half.h"
#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"

namespace fp4attn::golden {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Fixed offset folded into NVFP4 operands: e2m1 (<= 6) x scale (<= 448) / 8 <= 336 < 448.
constexpr double kNvfp4FoldDivisor = 8.0;

// NaN-propagating max |x| over a whole head slice (block_amax works on one block).
float slice_amax(const std::vector<float>& x) {
  float amax = 0.f;
  for (float v : x) {
    if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

// Q/K scale rule: restricted mantissas for nvfp4-hx, the paper's plain rule for fp4-direct,
// Four-Over-Six for the other NVFP4 recipes (measured: rel-L2 0.133 instead of 0.144 on
// Gaussian inputs, docs/decisions.md).
Nvfp4ScaleRule nvfp4_rule(Recipe r) {
  switch (r) {
    case Recipe::kNvfp4Hx:
      return Nvfp4ScaleRule::kRestricted;
    case Recipe::kFp4Direct:
      return Nvfp4ScaleRule::kNearest;
    default:
      return Nvfp4ScaleRule::kFourOverSix;
  }
}

// NVFP4 along the rows of `m` (blocks of 16 along cols). Folded: E4M3(e2m1 * scale / 8), factor
// 8 / s_enc. Exact: e2m1 * scale, factor 1 / s_enc.
Operand nvfp4_operand(const HeadMatrix& m, Nvfp4ScaleRule rule, Emulation emu, float s_enc) {
  if (s_enc == 0.f) s_enc = nvfp4_tensor_scale(slice_amax(m.x), rule);
  const int64_t sf_cols = (m.cols + kNvfp4Block - 1) / kNvfp4Block;
  std::vector<uint8_t> codes(m.rows * m.cols), scales(m.rows * sf_cols);
  nvfp4_quantize_rows(m.x.data(), m.rows, m.cols, m.cols, s_enc, rule, codes.data(), scales.data());
  const bool fold = emu == Emulation::kFoldedE4M3;
  Operand op{m.rows, m.cols, std::vector<double>(m.rows * m.cols), {}};
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const double scale = e4m3_to_float(scales[r * sf_cols + c / kNvfp4Block]);
      const double prod = e2m1_to_float(codes[r * m.cols + c]) * scale;  // exact
      op.val[r * m.cols + c] = fold ? round_to_e4m3(prod / kNvfp4FoldDivisor) : prod;
    }
  }
  // The factor is an FP32 quotient, as the GPU computes it.
  op.factor.assign(m.rows, (fold ? static_cast<float>(kNvfp4FoldDivisor) : 1.f) / s_enc);
  return op;
}

// Values code * 2^exp per block folded into E4M3 relative to the largest block exponent of the
// slice (exact while a block is within 14 binades of the largest); `exps` holds one exponent per
// element (kDirectNanExp marks NaN blocks). Returns the common factor 2^t.
double fold_pow2(const std::vector<double>& code_val, const std::vector<int>& exps, Emulation emu,
                 std::vector<double>* out) {
  int emax = -1000;
  for (int e : exps) {
    if (e != kDirectNanExp) emax = std::max(emax, e);
  }
  const int t = emax == -1000 ? 0 : emax - kOperandPow2FoldTop;
  const bool fold = emu == Emulation::kFoldedE4M3;
  out->resize(code_val.size());
  for (size_t i = 0; i < code_val.size(); ++i) {
    if (exps[i] == kDirectNanExp) {
      (*out)[i] = kNaN;
    } else if (fold) {
      (*out)[i] = round_to_e4m3(std::ldexp(code_val[i], exps[i] - t));
    } else {
      (*out)[i] = std::ldexp(code_val[i], exps[i]);
    }
  }
  return fold ? std::ldexp(1.0, t) : 1.0;
}

// MXFP4 along the rows of `m` (blocks of 32 along cols), OCP values e2m1 * 2^e.
Operand mxfp4_operand(const HeadMatrix& m, MxScaleRule rule, Emulation emu) {
  const int64_t sf_cols = (m.cols + kMxfp4Block - 1) / kMxfp4Block;
  std::vector<uint8_t> codes(m.rows * m.cols), scales(m.rows * sf_cols);
  mxfp4_quantize_rows(m.x.data(), m.rows, m.cols, m.cols, rule, codes.data(), scales.data());
  std::vector<double> code_val(m.rows * m.cols);
  std::vector<int> exps(m.rows * m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const uint8_t s = scales[r * sf_cols + c / kMxfp4Block];
      code_val[r * m.cols + c] = e2m1_to_float(codes[r * m.cols + c]);
      exps[r * m.cols + c] = s == 0xFF ? kDirectNanExp : int(s) - 127;
    }
  }
  Operand op{m.rows, m.cols, {}, {}};
  op.factor.assign(m.rows, fold_pow2(code_val, exps, emu, &op.val));
  return op;
}

// FP8 E4M3 with one FP32 scale per `block_rows` rows (all columns).
Operand fp8_row_block_operand(const HeadMatrix& m, int64_t block_rows) {
  Operand op{m.rows, m.cols, std::vector<double>(m.rows * m.cols), std::vector<double>(m.rows)};
  std::vector<uint8_t> codes(block_rows * m.cols);
  for (int64_t r0 = 0; r0 < m.rows; r0 += block_rows) {
    const int64_t n_rows = std::min(block_rows, m.rows - r0);
    const float scale = fp8_quantize_block(&m.x[r0 * m.cols], static_cast<int>(n_rows * m.cols), 1,
                                           Fp8Format::kE4M3, codes.data());
    for (int64_t i = 0; i < n_rows * m.cols; ++i) {
      op.val[r0 * m.cols + i] = e4m3_to_float(codes[i]);
    }
    for (int64_t r = r0; r < r0 + n_rows; ++r) op.factor[r] = scale;
  }
  return op;
}

// The int8 recipes' Q/K: INT8 codes per block_rows-token block over all columns
// (int8_quantize_block), factor = the block's scale.
Operand int8_row_block_operand(const HeadMatrix& m, int64_t block_rows) {
  Operand op{m.rows, m.cols, std::vector<double>(m.rows * m.cols), std::vector<double>(m.rows)};
  std::vector<int8_t> codes(block_rows * m.cols);
  for (int64_t r0 = 0; r0 < m.rows; r0 += block_rows) {
    const int64_t n_rows = std::min(block_rows, m.rows - r0);
    const float scale =
        int8_quantize_block(&m.x[r0 * m.cols], static_cast<int>(n_rows * m.cols), 1, codes.data());
    for (int64_t i = 0; i < n_rows * m.cols; ++i) op.val[r0 * m.cols + i] = codes[i];
    for (int64_t r = r0; r < r0 + n_rows; ++r) op.factor[r] = scale;
  }
  return op;
}

// The operand as BF16 values (the bf16 recipe), factor 1.
Operand bf16_operand(const HeadMatrix& m, int64_t factor_len) {
  Operand op{m.rows, m.cols, std::vector<double>(m.x.size()), std::vector<double>(factor_len, 1)};
  for (size_t i = 0; i < m.x.size(); ++i) op.val[i] = round_to_bf16(m.x[i]);
  return op;
}

// m transposed: [cols, rows].
HeadMatrix transposed(const HeadMatrix& m) {
  HeadMatrix t{m.cols, m.rows, std::vector<float>(m.x.size())};
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) t.x[c * m.rows + r] = m.x[r * m.cols + c];
  }
  return t;
}

// Operand of a transposed matrix back in [rows, cols] order (factor stays per channel).
Operand transposed(const Operand& t) {
  Operand op{t.cols, t.rows, std::vector<double>(t.val.size()), t.factor};
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) op.val[c * t.rows + r] = t.val[r * t.cols + c];
  }
  return op;
}

// The paper's MXFP4 V: per channel, blocks of 32 tokens, values alpha * q / 6.
Operand direct_v_operand(const HeadMatrix& v, Emulation emu) {
  HeadMatrix vt = transposed(v);  // [d, tokens]
  std::vector<double> code_val(vt.x.size());
  std::vector<int> exps(vt.x.size());
  std::vector<uint8_t> codes(kDirectBlock);
  for (int64_t c = 0; c < vt.rows; ++c) {
    for (int64_t t0 = 0; t0 < vt.cols; t0 += kDirectBlock) {
      const int n = static_cast<int>(std::min<int64_t>(kDirectBlock, vt.cols - t0));
      const int64_t base = c * vt.cols + t0;
      const int e = direct_v_quantize_block(&vt.x[base], n, 1, codes.data());
      for (int i = 0; i < n; ++i) {
        code_val[base + i] = e2m1_to_float(codes[i]);
        exps[base + i] = e;
      }
    }
  }
  Operand opt{vt.rows, vt.cols, {}, {}};
  // The paper's alpha * q / 6; the factor is an FP32 quotient, as the GPU computes it.
  const double f = static_cast<float>(fold_pow2(code_val, exps, emu, &opt.val)) / 6.f;
  opt.factor.assign(vt.rows, f);
  return transposed(opt);
}

}  // namespace

HeadMatrix gather_head(const TensorView& t, int64_t b, int64_t h) {
  HeadMatrix m{t.shape[1], t.shape[3], {}};
  m.x.resize(m.rows * m.cols);
  for (int64_t s = 0; s < m.rows; ++s) {
    const int64_t base = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
    for (int64_t c = 0; c < m.cols; ++c) {
      m.x[s * m.cols + c] = static_cast<float>(load_as_double(t, base + c * t.stride[3]));
    }
  }
  return m;
}

std::vector<double> smooth_keys(HeadMatrix* k) {
  std::vector<double> mean(k->cols, 0.0);
  if (k->rows == 0) return mean;
  for (int64_t s = 0; s < k->rows; ++s) {
    for (int64_t c = 0; c < k->cols; ++c) mean[c] += k->x[s * k->cols + c];
  }
  for (int64_t c = 0; c < k->cols; ++c) mean[c] = round_to_bf16(mean[c] / k->rows);
  for (int64_t s = 0; s < k->rows; ++s) {
    for (int64_t c = 0; c < k->cols; ++c) {
      k->x[s * k->cols + c] = static_cast<float>(k->x[s * k->cols + c] - mean[c]);
    }
  }
  return mean;
}

std::vector<double> smooth_keys_as(HeadMatrix* k, const RecipeOptions& opt) {
  return k_is_smoothed(opt.recipe, opt.smooth_k) ? smooth_keys(k) : std::vector<double>{};
}

std::vector<char> finite_rows(const std::vector<double>& val, int64_t rows, int64_t cols) {
  std::vector<char> finite(rows, 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) finite[r] = finite[r] && std::isfinite(val[r * cols + c]);
  }
  return finite;
}

double round_to_e4m3(double x) { return e4m3_to_float(float_to_e4m3(static_cast<float>(x))); }

double round_to_bf16(double x) {
  return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
}

Operand prepare_qk(const HeadMatrix& m, Recipe recipe, Emulation emu, float tensor_scale) {
  switch (operand_recipe(recipe)) {
    case Recipe::kBf16:
      return bf16_operand(m, m.rows);
    case Recipe::kFp8:
      return fp8_row_block_operand(m, kFp8QkBlockTokens);
    case Recipe::kInt8:
      return int8_row_block_operand(m, kFp8QkBlockTokens);
    case Recipe::kMxfp4:
      return mxfp4_operand(m, MxScaleRule::kRoundUp, emu);
    default:
      return nvfp4_operand(m, nvfp4_rule(recipe), emu, tensor_scale);
  }
}

Operand prepare_v(const HeadMatrix& m, Recipe recipe, Emulation emu, float tensor_scale) {
  switch (operand_recipe(recipe)) {
    case Recipe::kBf16:
      return bf16_operand(m, m.cols);
    case Recipe::kNvfp4All: {
      // NVFP4 along tokens: quantize V^T row-wise, then back to [tokens, d].
      Operand t = nvfp4_operand(transposed(m), Nvfp4ScaleRule::kNearest, emu, tensor_scale);
      return transposed(t);
    }
    case Recipe::kFp4Direct:
      return direct_v_operand(m, emu);
    default: {
      // FP8 E4M3 with one scale per channel over all tokens of the head.
      Operand op{m.rows, m.cols, std::vector<double>(m.x.size()), std::vector<double>(m.cols)};
      std::vector<uint8_t> codes(m.rows);
      for (int64_t c = 0; c < m.cols; ++c) {
        // With no tokens m.x is empty: &m.x[c] would bind a null reference (UBSan), and the
        // block reads nothing.
        const float* column = m.rows > 0 ? &m.x[c] : nullptr;
        op.factor[c] = fp8_quantize_block(column, static_cast<int>(m.rows), m.cols,
                                          Fp8Format::kE4M3, codes.data());
        for (int64_t r = 0; r < m.rows; ++r) op.val[r * m.cols + c] = e4m3_to_float(codes[r]);
      }
      return op;
    }
  }
}

void row_scores(const Operand& qo, const Operand& ko, int64_t i, int64_t n, double zscale,
                std::vector<double>* z) {
  const int64_t d = qo.cols;
  const double* qi = &qo.val[i * d];
  for (int64_t j = 0; j < n; ++j) {
    const double* kj = &ko.val[j * d];
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += qi[c] * kj[c];
    (*z)[j] = s * qo.factor[i] * ko.factor[j] * zscale;
  }
}

double q_dot_mean(const HeadMatrix& q, int64_t i, const std::vector<double>& kmean) {
  const int64_t d = q.cols;
  double qm = 0;
  for (int64_t c = 0; c < d; ++c) qm += double(q.x[i * d + c]) * kmean[c];
  return qm;
}

}  // namespace fp4attn::golden
