#include "support/p_dump_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "fp4attn/numerics/formats.h"
#include "reference/golden_operands.h"
#include "reference/golden_softmax.h"

namespace fp4attn::golden {
namespace {

// Below the E4M3 operand's smallest normal the grid stops scaling with the reference: a value
// made at another reference and rescaled by a power of two is no longer on it.
constexpr double kE4m3MinNormal = 0.015625;
constexpr double kE2m1Values[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
constexpr int kDirectFoldShift = 6;   // fp4-direct's operand is q * 2^(e + 6) (golden_softmax.cc)
constexpr double kZeroBlock = -1000;  // make_row_p's fp4-direct exponent of a zero block

// The E4M3 code of x if x is exactly a finite non-negative E4M3 value.
bool e4m3_code_of(double x, uint8_t* code) {
  if (!(x >= 0 && x <= 448)) return false;
  const float f = static_cast<float>(x);
  if (double(f) != x) return false;
  *code = float_to_e4m3(f);
  return double(e4m3_to_float(*code)) == x;
}

int64_t index_in(const std::vector<double>& grid, double x) {
  const auto it = std::lower_bound(grid.begin(), grid.end(), x);
  return it != grid.end() && *it == x ? it - grid.begin() : -1;
}

bool is_pow2(double x) {
  int e = 0;
  return x > 0 && std::frexp(x, &e) == 0.5;
}

// The kernel's block parameter candidates, read back from its operand values (at its own
// reference) of one block's visible keys: a fp4-direct block's largest code is 4 or 6
// (x of the block max lies in [log2 6 - 0.415, log2 6 + 0.585), so 1.5 x + 1.2 in [4.45, 5.95)),
// and a nvfp4-all block's is 6 (amax * 2688 / E4M3(amax * 448) lies in [5.65, 6.4]).
// Only parameters one step from the golden's (at the golden reference: exponents e +- 1, E4M3
// scales one code apart) are kept: a flip of the block's parameter, not a different block.
std::vector<double> kernel_block_params(Recipe recipe, double vmax, double golden_param,
                                        int shift) {
  std::vector<double> r;
  if (!(vmax > 0) || !std::isfinite(vmax)) return r;
  if (recipe == Recipe::kFp4Direct) {
    for (double top : {4.0, 6.0}) {
      if (!is_pow2(vmax / top)) continue;
      const int e = std::ilogb(vmax / top) - kDirectFoldShift;
      if (std::abs(e + shift - golden_param) == 1) r.push_back(e);
    }
  } else {
    const int c0 = float_to_e4m3(static_cast<float>(vmax * 8 / 6));
    const int golden_code = float_to_e4m3(static_cast<float>(golden_param));
    for (int c = std::max(1, c0 - 2); c <= std::min(0x7E, c0 + 2); ++c) {
      const double s = e4m3_to_float(static_cast<uint8_t>(c));
      uint8_t at_golden = 0;
      if (round_to_e4m3(6 * s / 8) != vmax || !e4m3_code_of(std::ldexp(s, shift), &at_golden)) {
        continue;
      }
      if (std::abs(int(at_golden) - golden_code) == 1) r.push_back(s);
    }
  }
  return r;
}

bool is_poison(float x, uint8_t poison) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits == poison * 0x01010101u;
}

}  // namespace

std::vector<double> p_block_grid(Recipe recipe, double param, int shift) {
  std::vector<double> g;
  for (double q : kE2m1Values) {
    double v = 0;
    if (recipe == Recipe::kFp4Direct) {
      v = param <= kZeroBlock ? 0 : round_to_e4m3(std::ldexp(q, int(param) + kDirectFoldShift));
    } else {
      v = round_to_e4m3(q * param / 8);
    }
    g.push_back(std::ldexp(v, shift));
  }
  std::sort(g.begin(), g.end());
  g.erase(std::unique(g.begin(), g.end()), g.end());
  return g;
}

PMatch classify_p(double gpu, double golden, int shift, const std::vector<double>& golden_grid,
                  const std::vector<std::vector<double>>& kernel_grids) {
  if (std::isnan(gpu) || std::isnan(golden) || gpu < 0) return PMatch::kOther;
  if (gpu == golden) return PMatch::kEqual;
  // Different references: below the smallest normal of the coarser one, the two roundings differ
  // (whether or not the values happen to be adjacent).
  if (shift != 0) {
    const double t = std::ldexp(kE4m3MinNormal, std::max(shift, 0));
    if (std::min(gpu, golden) < t && std::max(gpu, golden) < 2 * t) return PMatch::kUnderflowEdge;
  }
  if (golden_grid.empty()) {
    uint8_t a = 0, b = 0;
    if (e4m3_code_of(gpu, &a) && e4m3_code_of(golden, &b) && std::abs(int(a) - int(b)) == 1) {
      return PMatch::kOneCode;
    }
    return PMatch::kOther;
  }
  const int64_t b = index_in(golden_grid, golden);
  if (b < 0) return PMatch::kOther;
  const int64_t a = index_in(golden_grid, gpu);
  if (a >= 0 && std::abs(a - b) == 1) return PMatch::kOneCode;
  for (const auto& grid : kernel_grids) {
    const int64_t c = index_in(grid, gpu);
    if (c >= 0 && std::abs(c - b) <= 1) return PMatch::kParamFlip;
  }
  return PMatch::kOther;
}

void PDumpStats::add(const PDumpStats& s) {
  equal += s.equal;
  one_code += s.one_code;
  param_flip += s.param_flip;
  flipped_blocks += s.flipped_blocks;
  other_in_flipped += s.other_in_flipped;
  underflow_edge += s.underflow_edge;
  other += s.other;
  rescaled += s.rescaled;
  rescaled_blocks += s.rescaled_blocks;
  masked += s.masked;
  masked_nonzero += s.masked_nonzero;
  unwritten += s.unwritten;
  stray += s.stray;
  bad_m += s.bad_m;
  rows += s.rows;
  rows_final_m_differs += s.rows_final_m_differs;
  if (first_other.empty()) first_other = s.first_other;
}

std::string PDumpStats::summary() const {
  const double n = std::max<double>(1, double(compared()));
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "equal=%.4f%% one_code=%.4f%% param_flip=%.4f%% underflow_edge=%.4f%% other=%lld "
                "of %lld visible keys | rescaled keys=%.2f%% blocks=%lld | masked=%lld "
                "nonzero=%lld | unwritten=%lld stray=%lld bad_m=%lld | rows=%lld "
                "final_m_differs=%lld | flipped blocks=%lld (other in them=%lld)",
                100 * equal / n, 100 * one_code / n, 100 * param_flip / n, 100 * underflow_edge / n,
                (long long)other, (long long)compared(), 100 * rescaled / n,
                (long long)rescaled_blocks, (long long)masked, (long long)masked_nonzero,
                (long long)unwritten, (long long)stray, (long long)bad_m, (long long)rows,
                (long long)rows_final_m_differs, (long long)flipped_blocks,
                (long long)other_in_flipped);
  return buf;
}

void compare_p_row(const uint8_t* p, const float* m, int64_t block_keys, int64_t blocks,
                   int64_t written_blocks, uint8_t poison, const std::vector<double>& z, int64_t n,
                   const RecipeOptions& opt, const std::string& where, PDumpStats* st) {
  auto note = [&](const std::string& what) {
    if (st->first_other.empty()) st->first_other = where + ": " + what;
  };
  const int64_t key_end = written_blocks * block_keys;
  for (int64_t j = written_blocks; j < blocks; ++j) {
    if (!is_poison(m[j], poison)) {
      ++st->stray;
      note("m of unprocessed block " + std::to_string(j) + " written");
    }
  }
  for (int64_t k = key_end; k < blocks * block_keys; ++k) {
    if (p[k] != poison) {
      ++st->stray;
      note("P of unprocessed key " + std::to_string(k) + " written");
    }
  }
  if (n > key_end) {
    st->unwritten += n - key_end;
    note("visible keys past the processed blocks");
  }
  RowP gp;
  std::vector<double> param;
  double m_final = 0;
  if (n > 0) {
    gp = make_row_p(z, n, opt, &param);
    m_final = integer_row_max(z, n);
    ++st->rows;
  }
  const bool block_scaled = opt.recipe == Recipe::kFp4Direct || opt.recipe == Recipe::kNvfp4All;
  const int64_t sub = opt.recipe == Recipe::kFp4Direct ? 32 : 16;
  std::vector<double> golden_grid;
  std::vector<std::vector<double>> kernel_grids;
  float prev = -std::numeric_limits<float>::infinity();
  bool last_m_ok = false;
  for (int64_t j = 0; j < written_blocks; ++j) {
    const float mj = m[j];
    bool m_ok = true;
    if (is_poison(mj, poison)) {
      ++st->unwritten;
      m_ok = false;
      note("m of block " + std::to_string(j) + " not written");
    } else if (!(std::isinf(mj) && mj < 0) &&
               !(std::isfinite(mj) && mj == std::nearbyint(mj) && mj >= prev)) {
      ++st->bad_m;
      m_ok = false;
      note("m of block " + std::to_string(j) + " = " + std::to_string(mj));
    } else if (std::isinf(mj) && j * block_keys < n) {
      ++st->bad_m;
      m_ok = false;
      note("m of block " + std::to_string(j) + " is -inf with visible keys");
    }
    if (m_ok) prev = mj;
    last_m_ok = m_ok;
    // The kernel makes P with m_use = 0 while m is -inf (then every key is masked).
    const int shift = m_ok && std::isfinite(mj) ? int(double(mj) - m_final) : 0;
    const int64_t k0 = j * block_keys;
    if (shift != 0 && k0 < n) ++st->rescaled_blocks;
    for (int64_t k = k0; k < k0 + block_keys; ++k) {
      const uint8_t byte = p[k];
      if (byte == poison) {  // never a P byte: negative
        ++st->unwritten;
        note("P of key " + std::to_string(k) + " not written");
        continue;
      }
      if (k >= n) {
        ++st->masked;
        if (byte != 0) {
          ++st->masked_nonzero;
          note("masked key " + std::to_string(k) + " has P byte " + std::to_string(byte));
        }
        continue;
      }
      if (block_scaled && (k - k0) % sub == 0) {  // the block's golden and kernel grids
        const int64_t k1 = std::min(k + sub, n);
        golden_grid = p_block_grid(opt.recipe, param[k], 0);
        double vmax = 0;
        for (int64_t i = k; i < k1; ++i) {
          const double v = e4m3_to_float(p[i]);
          if (v > vmax) vmax = v;
        }
        kernel_grids.clear();
        for (double kp : kernel_block_params(opt.recipe, vmax, param[k], shift)) {
          kernel_grids.push_back(p_block_grid(opt.recipe, kp, shift));
        }
        // A flip only if the block holds a kernel value off the golden's grid.
        bool off_grid = false;
        for (int64_t i = k; i < k1; ++i) {
          off_grid |= index_in(golden_grid, std::ldexp(double(e4m3_to_float(p[i])), shift)) < 0;
        }
        if (!off_grid) kernel_grids.clear();
        st->flipped_blocks += !kernel_grids.empty();
      }
      const double gpu = std::ldexp(double(e4m3_to_float(byte)), shift);
      const double golden = gp.p[k];
      st->rescaled += shift != 0;
      switch (classify_p(gpu, golden, shift, golden_grid, kernel_grids)) {
        case PMatch::kEqual:
          ++st->equal;
          break;
        case PMatch::kOneCode:
          ++st->one_code;
          break;
        case PMatch::kParamFlip:
          ++st->param_flip;
          break;
        case PMatch::kUnderflowEdge:
          ++st->underflow_edge;
          break;
        case PMatch::kOther:
          ++st->other;
          st->other_in_flipped += !kernel_grids.empty();
          note("key " + std::to_string(k) + ": kernel " + std::to_string(gpu) + " (byte " +
               std::to_string(byte) + ", shift " + std::to_string(shift) + ") vs golden " +
               std::to_string(golden));
          break;
      }
    }
  }
  if (n > 0 && written_blocks > 0 && last_m_ok && double(m[written_blocks - 1]) != m_final) {
    ++st->rows_final_m_differs;
  }
}

}  // namespace fp4attn::golden
