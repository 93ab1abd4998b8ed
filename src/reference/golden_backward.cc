// The golden model's backward: per (batch, query head), rebuild the forward's operands, scores and
// P, then dP, D, dS and the three gradients, in float64 or with the GPU's FP8 GEMM operands.
// dk/dv are kept per query head and summed over each GQA group afterwards in a fixed order.
#include "fp4attn/golden/golden_backward.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "reference/golden_backward_fp8.h"
#include "reference/golden_backward_p.h"
#include "reference/golden_operands.h"
#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

using golden::HeadMatrix;
using golden::Operand;

struct Task {
  const TensorView *q, *k, *v, *o, *dout, *lse, *dq;
  const RecipeOptions* opt;
  const BackwardOptions* bopt;
  AttentionShape sh;
  double scale;
};

int64_t visible_keys(const AttentionShape& sh, bool causal, int64_t i) {
  if (!causal) return sh.s_k;
  return std::clamp<int64_t>(i + sh.s_k - sh.s_q + 1, 0, sh.s_k);
}

// Dequantized operand: the real value each E4M3/BF16 element of the GEMM stands for.
std::vector<double> dequantized(const Operand& op, bool per_row) {
  std::vector<double> x(op.val.size());
  for (int64_t r = 0; r < op.rows; ++r) {
    for (int64_t c = 0; c < op.cols; ++c) {
      x[r * op.cols + c] = op.val[r * op.cols + c] * op.factor[per_row ? r : c];
    }
  }
  return x;
}

// One (batch, head) of a BSHD tensor as dense [s][d] doubles. dO and O are read at full precision
// (golden::gather_head's FP32 view is for the operands the forward quantizes).
struct Rows {
  std::vector<double> x;
};
Rows gather_rows_f64(const TensorView& t, int64_t b, int64_t h) {
  const int64_t s_len = t.shape[1], d = t.shape[3];
  Rows r{std::vector<double>(s_len * d)};
  for (int64_t s = 0; s < s_len; ++s) {
    const int64_t base = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
    for (int64_t c = 0; c < d; ++c) r.x[s * d + c] = load_as_double(t, base + c * t.stride[3]);
  }
  return r;
}

// What one head's rows need besides the operands: P, dP and dS [s_q][s_k] (zero where masked).
struct HeadGrads {
  std::vector<double> p, dp, ds;
};

// Gradients in float64 from the dequantized operands.
void grads_f64(const Task& t, const HeadGrads& g, const std::vector<double>& qe,
               const std::vector<double>& ke, const Rows& dout, std::vector<double>* dq, double* dk,
               double* dv) {
  const AttentionShape& sh = t.sh;
  const int64_t d = sh.d;
  for (int64_t i = 0; i < sh.s_q; ++i) {
    const int64_t n = visible_keys(sh, t.opt->causal, i);
    for (int64_t j = 0; j < n; ++j) {
      const double ds = g.ds[i * sh.s_k + j], p = g.p[i * sh.s_k + j];
      for (int64_t c = 0; c < d; ++c) {
        (*dq)[i * d + c] += t.scale * ds * ke[j * d + c];
        dk[j * d + c] += t.scale * ds * qe[i * d + c];
        dv[j * d + c] += p * dout.x[i * d + c];
      }
    }
  }
}

// DsScales::kPerTile: the exponents of dS's E4M3 operands per tile of kTileQueries x kTileKeys
// (the v2 kernel's step: 64 queries of one head against its CTA's 128 keys). dQ's: the tile's own
// amax of |dS k_scale|. dK's: per key block, the running minimum over the head's query blocks in
// ascending order (the kernel's step order) of the tiles' exponents for |dS q_scale|; tiles whose
// dS is all zero (masked) leave it unchanged.
constexpr int64_t kTileQueries = 64, kTileKeys = 128;
struct TileExponents {
  int64_t key_blocks = 0;
  std::vector<int> e_dq, e_dk;  // [query block][key block]
  int dq(int64_t i, int64_t j) const {
    return e_dq[(i / kTileQueries) * key_blocks + j / kTileKeys];
  }
  int dk(int64_t i, int64_t j) const {
    return e_dk[(i / kTileQueries) * key_blocks + j / kTileKeys];
  }
};

TileExponents tile_exponents(const AttentionShape& sh, const std::vector<double>& ds_k,
                             const std::vector<double>& ds_q) {
  TileExponents t;
  const int64_t qb_n = (sh.s_q + kTileQueries - 1) / kTileQueries;
  t.key_blocks = (sh.s_k + kTileKeys - 1) / kTileKeys;
  t.e_dq.assign(qb_n * t.key_blocks, 0);
  t.e_dk.assign(qb_n * t.key_blocks, 0);
  for (int64_t kb = 0; kb < t.key_blocks; ++kb) {
    bool set = false;
    int running = 0;
    for (int64_t qb = 0; qb < qb_n; ++qb) {
      double m_k = 0, m_q = 0;
      for (int64_t i = qb * kTileQueries; i < std::min(sh.s_q, (qb + 1) * kTileQueries); ++i) {
        for (int64_t j = kb * kTileKeys; j < std::min(sh.s_k, (kb + 1) * kTileKeys); ++j) {
          m_k = std::max(m_k, std::abs(ds_k[i * sh.s_k + j]));
          m_q = std::max(m_q, std::abs(ds_q[i * sh.s_k + j]));
        }
      }
      const int64_t x = qb * t.key_blocks + kb;
      t.e_dq[x] = golden::pow2_scale_exp(m_k, golden::kE4m3TopLog2);
      if (m_q > 0) {
        const int e = golden::pow2_scale_exp(m_q, golden::kE4m3TopLog2);
        running = set ? std::min(running, e) : e;
        set = true;
      }
      t.e_dk[x] = running;
    }
  }
  return t;
}

// Gradients with the GPU's operands: P and dS in E4M3, dO in E5M2, each scaled by a power of two
// that the float64 epilogue undoes (numerics.md §8). Per-token factors of K (Q) sit on dQ's (dK's)
// contraction index, so they are folded into dS before rounding, and V's per-channel factor into
// dO for dP.
void grads_emulated(const Task& t, HeadGrads* g, const Operand& qo, const Operand& ko,
                    const Operand& vo, const Rows& dout, const Rows& o, std::vector<double>* drow,
                    std::vector<double>* dq, double* dk, double* dv) {
  const AttentionShape& sh = t.sh;
  const int64_t d = sh.d, sk = sh.s_k;
  const bool scaled = t.bopt->scale_gradients;
  const int lift = t.bopt->p_lift_log2;
  std::vector<double> dov(dout.x.begin(), dout.x.end()), dofv(dov.size());
  for (int64_t i = 0; i < sh.s_q; ++i) {
    for (int64_t c = 0; c < d; ++c) dofv[i * d + c] = dov[i * d + c] * vo.factor[c];
  }
  const int g_do = scaled ? golden::pow2_scale_exp(golden::abs_max(dov), golden::kE5m2TopLog2) : 0;
  const int g_dp = scaled ? golden::pow2_scale_exp(golden::abs_max(dofv), golden::kE5m2TopLog2) : 0;
  for (double& x : dov) x = golden::e5m2_scaled(x, g_do);
  for (double& x : dofv) x = golden::e5m2_scaled(x, g_dp);
  // D from the forward's O: D_i = sum_c dO'_c O_c with dO' the dO that dP sees (its E5M2 value,
  // V's channel factor and 2^g' undone). D from the unrounded dO would leave sum_j P_ij dP_ij - D_i
  // equal to dO's rounding error dotted with O: the rows of dS would not sum to zero, and a sharp
  // row's dS, ~0 in exact arithmetic, would be that error (numerics.md §8, "D consistent with
  // dP"). Computed for kHighPrecisionO too: the dS scales h, h' come from the dS it gives.
  std::vector<double> d_fwd(sh.s_q, 0.0);
  for (int64_t i = 0; i < sh.s_q; ++i) {
    double acc = 0;
    for (int64_t c = 0; c < d; ++c) {
      if (vo.factor[c] != 0) acc += dofv[i * d + c] * o.x[i * d + c] / vo.factor[c];
    }
    d_fwd[i] = std::ldexp(acc, -g_dp);
  }

  // dP from the E5M2 dO (V's channel factor folded in) and V's E4M3 values, then dS.
  for (int64_t i = 0; i < sh.s_q; ++i) {
    const int64_t n = visible_keys(sh, t.opt->causal, i);
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < d; ++c) acc += dofv[i * d + c] * vo.val[j * d + c];
      g->dp[i * sk + j] = std::ldexp(acc, -g_dp);
    }
  }
  std::vector<double> ds_k(g->ds.size(), 0.0), ds_q(g->ds.size(), 0.0);
  auto form_ds = [&](const std::vector<double>& drow_i) {
    for (int64_t i = 0; i < sh.s_q; ++i) {
      const int64_t n = visible_keys(sh, t.opt->causal, i);
      for (int64_t j = 0; j < n; ++j) {
        const double ds = g->p[i * sk + j] * (g->dp[i * sk + j] - drow_i[i]);
        g->ds[i * sk + j] = ds;
        ds_k[i * sk + j] = ds * ko.factor[j];  // dQ contracts over keys
        ds_q[i * sk + j] = ds * qo.factor[i];  // dK contracts over queries
      }
    }
  };
  form_ds(d_fwd);
  // The dS scales from D_fwd's dS in either mode: the GPU finds them in a first pass over the
  // scores, which cannot know D_hp (a sum over every key) yet. D_hp's dS fits their headroom
  // (top 2^8, E4M3 max 448; the rounding saturates).
  const int h_dq = scaled ? golden::pow2_scale_exp(golden::abs_max(ds_k), golden::kE4m3TopLog2) : 0;
  const int h_dk = scaled ? golden::pow2_scale_exp(golden::abs_max(ds_q), golden::kE4m3TopLog2) : 0;
  if (t.bopt->d_source == DSource::kHighPrecisionO) {
    // D_i = sum_j p_ij dP_ij of the very p and dP that form dS: its rows sum to zero, whatever
    // the forward's P rounding and dO's E5M2 rounding did (numerics.md §8).
    for (int64_t i = 0; i < sh.s_q; ++i) {
      const int64_t n = visible_keys(sh, t.opt->causal, i);
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += g->p[i * sk + j] * g->dp[i * sk + j];
      (*drow)[i] = acc;
    }
    form_ds(*drow);
  } else {
    *drow = d_fwd;
  }
  // The exponents of element (i, j): per head, or per tile (DsScales::kPerTile, from the final dS).
  const bool per_tile = scaled && t.bopt->ds_scales == DsScales::kPerTile;
  const TileExponents tiles = per_tile ? tile_exponents(sh, ds_k, ds_q) : TileExponents{};
  const double dv_unscale = std::ldexp(1.0, -(lift + g_do));
  for (int64_t i = 0; i < sh.s_q; ++i) {
    const int64_t n = visible_keys(sh, t.opt->causal, i);
    for (int64_t j = 0; j < n; ++j) {
      const int e_dq = per_tile ? tiles.dq(i, j) : h_dq;
      const int e_dk = per_tile ? tiles.dk(i, j) : h_dk;
      const double a = golden::e4m3_scaled(ds_k[i * sk + j], e_dq);
      const double b = golden::e4m3_scaled(ds_q[i * sk + j], e_dk);
      const double p8 = golden::e4m3_scaled(g->p[i * sk + j], lift);
      const double dq_unscale = t.scale * std::ldexp(1.0, -e_dq);
      const double dk_unscale = t.scale * std::ldexp(1.0, -e_dk);
      for (int64_t c = 0; c < d; ++c) {
        (*dq)[i * d + c] += dq_unscale * a * ko.val[j * d + c];
        dk[j * d + c] += dk_unscale * b * qo.val[i * d + c];
        dv[j * d + c] += dv_unscale * p8 * dov[i * d + c];
      }
    }
  }
}

// One (batch, query head): writes its dq rows and its share of dk/dv ([s_k][d] each).
void run_head(const Task& t, int64_t b, int64_t h, double* dk, double* dv) {
  const AttentionShape& sh = t.sh;
  const RecipeOptions& opt = *t.opt;
  const int64_t hk = h / (sh.h / sh.h_kv), d = sh.d, sk = sh.s_k;
  const HeadMatrix q = golden::gather_head(*t.q, b, h);
  HeadMatrix k = golden::gather_head(*t.k, b, hk);
  const HeadMatrix v = golden::gather_head(*t.v, b, hk);
  const Rows dout = gather_rows_f64(*t.dout, b, h);
  const Rows o = gather_rows_f64(*t.o, b, h);
  const std::vector<double> kmean = golden::smooth_keys_as(&k, opt);
  // The forward's operands, bit for bit (same functions, same inputs).
  const Operand qo = golden::prepare_qk(q, opt.recipe, opt.emulation, opt.q_tensor_scale);
  const Operand ko = golden::prepare_qk(k, opt.recipe, opt.emulation, opt.k_tensor_scale);
  const Operand vo = golden::prepare_v(v, opt.recipe, opt.emulation, opt.v_tensor_scale);
  const std::vector<double> qe = dequantized(qo, true), ke = dequantized(ko, true);
  const std::vector<double> ve = dequantized(vo, false);

  HeadGrads g{std::vector<double>(sh.s_q * sk, 0.0), std::vector<double>(sh.s_q * sk, 0.0),
              std::vector<double>(sh.s_q * sk, 0.0)};
  std::vector<double> z(sk), prow, drow(sh.s_q, 0.0);
  const double zscale = t.scale * std::numbers::log2e;
  const TensorView& lse = *t.lse;
  for (int64_t i = 0; i < sh.s_q; ++i) {
    const int64_t n = visible_keys(sh, opt.causal, i);
    if (n == 0) continue;  // no keys: P, dS and this row's gradients are all zero
    golden::row_scores(qo, ko, i, n, zscale, &z);  // the forward's expression, in its order
    double row_lse = load_as_double(lse, b * lse.stride[0] + h * lse.stride[1] + i * lse.stride[2]);
    if (k_is_smoothed(
            opt.recipe,
            opt.smooth_k)) {  // the forward added scale * q . mean to the LSE, not to the scores
      row_lse -= t.scale * golden::q_dot_mean(q, i, kmean);
    }
    golden::backward_row_p(z, n, row_lse * std::numbers::log2e, opt, &prow);
    double d_fwd = 0, d_hp = 0;
    for (int64_t c = 0; c < d; ++c) d_fwd += dout.x[i * d + c] * o.x[i * d + c];
    for (int64_t j = 0; j < n; ++j) {
      double dp = 0;
      for (int64_t c = 0; c < d; ++c) dp += dout.x[i * d + c] * ve[j * d + c];
      g.p[i * sk + j] = prow[j];
      g.dp[i * sk + j] = dp;
      d_hp += prow[j] * dp;  // = dO . (sum_j p_j v_j)
    }
    drow[i] = t.bopt->d_source == DSource::kForwardO ? d_fwd : d_hp;
    for (int64_t j = 0; j < n; ++j) {
      g.ds[i * sk + j] = g.p[i * sk + j] * (g.dp[i * sk + j] - drow[i]);
    }
  }

  std::vector<double> dq(sh.s_q * d, 0.0);
  if (t.bopt->arithmetic == BackwardArithmetic::kFloat64) {
    grads_f64(t, g, qe, ke, dout, &dq, dk, dv);
  } else {
    grads_emulated(t, &g, qo, ko, vo, dout, o, &drow, &dq, dk, dv);
  }
  const TensorView& dqv = *t.dq;
  for (int64_t i = 0; i < sh.s_q; ++i) {
    const int64_t base = b * dqv.stride[0] + i * dqv.stride[1] + h * dqv.stride[2];
    for (int64_t c = 0; c < d; ++c) store_from_double(dqv, base + c * dqv.stride[3], dq[i * d + c]);
  }
}

Status check_options(const RecipeOptions& opt, const BackwardOptions& bopt) {
  FP4ATTN_RETURN_IF_ERROR(check_recipe_value(opt.recipe));
  if (bopt.arithmetic == BackwardArithmetic::kEmulatedFp8 && opt.recipe == Recipe::kBf16) {
    return Status::Invalid("arithmetic: kEmulatedFp8 needs an FP8/FP4 recipe, got bf16");
  }
  if (bopt.p_lift_log2 < 0 || bopt.p_lift_log2 > 8) {
    return Status::Invalid("p_lift_log2: expected 0..8 (E4M3 max 448), got " +
                           std::to_string(bopt.p_lift_log2));
  }
  return Status::Ok();
}

}  // namespace

Status golden_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& o, const TensorView& dout, const TensorView& lse,
                                 const RecipeOptions& opt, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv,
                                 const BackwardOptions& bopt) {
  Task t{&q, &k, &v, &o, &dout, &lse, &dq, &opt, &bopt, {}, 0};
  const auto floats = {DType::kF64, DType::kF32, DType::kBF16, DType::kF16};
  if (!lse.defined()) return Status::Invalid("lse: required (the forward's LSE [b, h, s_q])");
  FP4ATTN_RETURN_IF_ERROR(
      validate_attention(q, k, v, dout, lse, floats, floats, {64, 128}, &t.sh, "dout"));
  FP4ATTN_RETURN_IF_ERROR(
      validate_attention(q, k, v, o, TensorView{}, floats, floats, {64, 128}, &t.sh, "o"));
  FP4ATTN_RETURN_IF_ERROR(check_like(dq, "dq", q, "q", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_like(dk, "dk", k, "k", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_like(dv, "dv", v, "v", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, t.sh.d, &t.scale));
  FP4ATTN_RETURN_IF_ERROR(check_options(opt, bopt));

  const AttentionShape& sh = t.sh;
  const int64_t d = sh.d, slice = sh.s_k * d;
  std::vector<double> dk_part(sh.b * sh.h * slice, 0.0), dv_part(sh.b * sh.h * slice, 0.0);
  parallel_for(sh.b * sh.h, [&](int64_t bh) {
    // data() + offset, not &v[offset]: with s_k = 0 the vectors are empty (UBSan's null binding).
    run_head(t, bh / sh.h, bh % sh.h, dk_part.data() + bh * slice, dv_part.data() + bh * slice);
  });

  // Sum each GQA group in head order (deterministic), then store.
  const int64_t group = sh.h_kv > 0 ? sh.h / sh.h_kv : 1;
  parallel_for(sh.b * sh.h_kv, [&](int64_t bk) {
    const int64_t b = bk / sh.h_kv, hk = bk % sh.h_kv;
    std::vector<double> sk(slice, 0.0), sv(slice, 0.0);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const int64_t base = (b * sh.h + h) * slice;
      for (int64_t x = 0; x < slice; ++x) {
        sk[x] += dk_part[base + x];
        sv[x] += dv_part[base + x];
      }
    }
    if (k_is_smoothed(opt.recipe, opt.smooth_k) && sh.s_k > 0) {
      // K was smoothed as k_j - mean(k) (the mean's BF16 rounding straight through): the chain
      // rule subtracts the mean gradient, which vanishes when each row of dS sums to zero.
      for (int64_t c = 0; c < d; ++c) {
        double mean = 0;
        for (int64_t j = 0; j < sh.s_k; ++j) mean += sk[j * d + c];
        mean /= static_cast<double>(sh.s_k);
        for (int64_t j = 0; j < sh.s_k; ++j) sk[j * d + c] -= mean;
      }
    }
    for (int64_t j = 0; j < sh.s_k; ++j) {
      const int64_t kb = b * dk.stride[0] + j * dk.stride[1] + hk * dk.stride[2];
      const int64_t vb = b * dv.stride[0] + j * dv.stride[1] + hk * dv.stride[2];
      for (int64_t c = 0; c < d; ++c) {
        store_from_double(dk, kb + c * dk.stride[3], sk[j * d + c]);
        store_from_double(dv, vb + c * dv.stride[3], sv[j * d + c]);
      }
    }
  });
  return Status::Ok();
}

}  // namespace fp4attn
