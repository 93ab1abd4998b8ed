#include "reference/golden_backward_p.h"

#include <cmath>

#include "reference/golden_softmax.h"

namespace fp4attn::golden {

bool has_exp_free_p(Recipe r) { return recipe_p_is_exp_free(r); }

void backward_row_p(const std::vector<double>& z, int64_t n, double lse_log2,
                    const RecipeOptions& opt, std::vector<double>* p) {
  p->assign(n, 0.0);
  if (has_exp_free_p(opt.recipe)) {
    // The forward's codes: its denominator sums these same rounded values, so p sums to 1.
    const RowP r = make_row_p(z, n, opt);
    for (int64_t j = 0; j < n; ++j) (*p)[j] = r.p[j] * r.p_unit / r.l;
    return;
  }
  // exp2 recipes: the saved LSE folds the integer reference, the lift and l into one number.
  for (int64_t j = 0; j < n; ++j) (*p)[j] = std::exp2(z[j] - lse_log2);
}

}  // namespace fp4attn::golden
