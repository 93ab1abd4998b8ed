// The golden model's attention loop: per (batch, head), quantize the operands as the recipe
// says, then for each query row form the scores, P and the normalized output in float64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "core/parallel.h"
#include "fp4attn/golden/golden.h"
#include "reference/golden_operands.h"
#include "reference/golden_softmax.h"
#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

using golden::HeadMatrix;
using golden::Operand;

Status check_tensor_scale(float s, const char* name) {
  if (std::isfinite(s) && s >= 0) return Status::Ok();
  return Status::Invalid(std::string(name) +
                         ": expected a finite value >= 0 (0 = computed from the data), got " +
                         std::to_string(s));
}

struct HeadTask {
  const TensorView *q, *k, *v, *o, *lse;
  const RecipeOptions* opt;
  AttentionShape shape;
  double scale;
};

void run_head(const HeadTask& t, int64_t b, int64_t h, RecipeStats* stats) {
  const AttentionShape& sh = t.shape;
  const int64_t hk = h / (sh.h / sh.h_kv);
  const RecipeOptions& opt = *t.opt;
  HeadMatrix q = golden::gather_head(*t.q, b, h);
  HeadMatrix k = golden::gather_head(*t.k, b, hk);
  HeadMatrix v = golden::gather_head(*t.v, b, hk);
  const std::vector<double> kmean = golden::smooth_keys_as(&k, opt);

  const Operand qo = golden::prepare_qk(q, opt.recipe, opt.emulation, opt.q_tensor_scale);
  const Operand ko = golden::prepare_qk(k, opt.recipe, opt.emulation, opt.k_tensor_scale);
  const Operand vo = golden::prepare_v(v, opt.recipe, opt.emulation, opt.v_tensor_scale);

  const double zscale = t.scale * std::numbers::log2e;
  const int64_t d = sh.d;
  std::vector<double> z(sh.s_k), acc(d);
  const std::vector<char> v_finite = golden::finite_rows(vo.val, vo.rows, d);
  for (int64_t i = 0; i < sh.s_q; ++i) {
    int64_t n = sh.s_k;
    if (opt.causal) n = std::clamp<int64_t>(i + sh.s_k - sh.s_q + 1, 0, sh.s_k);
    const TensorView& o = *t.o;
    const int64_t obase = b * o.stride[0] + i * o.stride[1] + h * o.stride[2];
    double lse = std::numeric_limits<double>::infinity();  // a row without keys
    std::fill(acc.begin(), acc.end(), 0.0);
    if (n > 0) {
      golden::row_scores(qo, ko, i, n, zscale, &z);
      const golden::RowP p = golden::make_row_p(z, n, opt);
      for (int64_t j = 0; j < n; ++j) {
        const double pj = p.p[j];
        if (pj == 0 && v_finite[j]) continue;  // 0 * (inf or NaN) is NaN, as in float64
        const double* vj = &vo.val[j * d];
        for (int64_t c = 0; c < d; ++c) acc[c] += pj * vj[c];
      }
      for (int64_t c = 0; c < d; ++c) acc[c] *= vo.factor[c] * p.p_unit / p.l;
      lse = p.lse_log2 * std::numbers::ln2;
      if (k_is_smoothed(opt.recipe, opt.smooth_k)) {  // softmax ignores q . mean, the LSE not
        lse += t.scale * golden::q_dot_mean(q, i, kmean);
      }
      if (stats) {
        stats[0].p_elements += n;
        stats[0].p_zero += p.zeros;
      }
    }
    for (int64_t c = 0; c < d; ++c) store_from_double(o, obase + c * o.stride[3], acc[c]);
    if (t.lse->defined()) {
      const TensorView& l = *t.lse;
      store_from_double(l, b * l.stride[0] + h * l.stride[1] + i * l.stride[2], lse);
    }
  }
}

}  // namespace

Status golden_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const RecipeOptions& opt, const TensorView& o,
                                const TensorView& lse, RecipeStats* stats) {
  HeadTask task{&q, &k, &v, &o, &lse, &opt, {}, 0};
  FP4ATTN_RETURN_IF_ERROR(validate_attention(
      q, k, v, o, lse, {DType::kF64, DType::kF32, DType::kBF16, DType::kF16},
      {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}, {64, 128}, &task.shape));
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, task.shape.d, &task.scale));
  FP4ATTN_RETURN_IF_ERROR(check_tensor_scale(opt.q_tensor_scale, "q_tensor_scale"));
  FP4ATTN_RETURN_IF_ERROR(check_tensor_scale(opt.k_tensor_scale, "k_tensor_scale"));
  FP4ATTN_RETURN_IF_ERROR(check_tensor_scale(opt.v_tensor_scale, "v_tensor_scale"));
  FP4ATTN_RETURN_IF_ERROR(check_recipe_value(opt.recipe));
  const int64_t heads = task.shape.b * task.shape.h;
  std::vector<RecipeStats> per_head(heads);
  parallel_for(heads, [&](int64_t bh) {
    run_head(task, bh / task.shape.h, bh % task.shape.h, &per_head[bh]);
  });
  if (stats) {
    *stats = RecipeStats{};
    for (const RecipeStats& s : per_head) {
      stats->p_elements += s.p_elements;
      stats->p_zero += s.p_zero;
    }
  }
  return Status::Ok();
}

}  // namespace fp4attn
