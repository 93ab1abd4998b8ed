#include "reference/golden_backward_fp8.h"

#include <algorithm>
#include <cmath>

#include "fp4attn/numerics/formats.h"

namespace fp4attn::golden {

int pow2_scale_exp(double amax, int top_log2) {
  if (!(amax > 0) || !std::isfinite(amax)) return 0;
  return top_log2 - static_cast<int>(std::ceil(std::log2(amax)));
}

double abs_max(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) {
    if (!std::isnan(v)) m = std::max(m, std::fabs(v));
  }
  return m;
}

// Scaling by 2^e is exact in double; the FP32 cast is what the GPU holds before converting.
double e4m3_scaled(double x, int e) {
  return e4m3_to_float(float_to_e4m3(static_cast<float>(std::ldexp(x, e))));
}

double e5m2_scaled(double x, int e) {
  return e5m2_to_float(float_to_e5m2(static_cast<float>(std::ldexp(x, e))));
}

}  // namespace fp4attn::golden
