#include "harness/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// num/den with 0/0 -> 0 and x/0 -> inf, for the relative errors.
double safe_ratio(double num, double den) {
  if (den == 0) return num == 0 ? 0 : kInf;
  return num / den;
}

// The elements of t in row-major logical order, whatever its strides.
std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> out(t.numel());
  int64_t index[kMaxRank] = {0, 0, 0, 0};
  for (double& x : out) {
    int64_t off = 0;
    for (int i = 0; i < t.rank; ++i) off += index[i] * t.stride[i];
    x = load_as_double(t, off);
    for (int i = t.rank - 1; i >= 0; --i) {  // odometer increment, last dimension fastest
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
  }
  return out;
}

Status check_comparable(const TensorView& t, const char* name) {
  FP4ATTN_RETURN_IF_ERROR(
      check_dtype(t, name, {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}));
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return Status::Invalid(std::string(name) + ": negative size");
    if (t.stride[i] < 0) return Status::Invalid(std::string(name) + ": negative stride");
  }
  return check_not_null(t, name);
}

}  // namespace

ErrorStats compare(const double* test, const double* ref, int64_t n) {
  ErrorStats s;
  s.n = n;
  double dot = 0, tt = 0, rr = 0, diff2 = 0, diff1 = 0, ref1 = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double t = test[i], r = ref[i];
    if (std::isnan(t) != std::isnan(r)) ++s.nan_mismatch;
    if (std::isinf(t) != std::isinf(r) || (std::isinf(t) && std::signbit(t) != std::signbit(r))) {
      ++s.inf_mismatch;
    }
    if (!std::isfinite(t) || !std::isfinite(r)) continue;
    const double e = t - r;
    ++finite;
    dot += t * r;
    tt += t * t;
    rr += r * r;
    diff2 += e * e;
    diff1 += std::fabs(e);
    ref1 += std::fabs(r);
    s.max_abs = std::max(s.max_abs, std::fabs(e));
  }
  if (tt == 0 && rr == 0) {
    s.cos = 1;  // identical all-zero vectors
  } else if (tt == 0 || rr == 0) {
    s.cos = 0;
  } else {
    // sqrt(tt * rr) makes identical vectors give exactly 1; the split form avoids over/underflow.
    const double norms =
        std::isnormal(tt * rr) ? std::sqrt(tt * rr) : std::sqrt(tt) * std::sqrt(rr);
    s.cos = std::clamp(dot / norms, -1.0, 1.0);
  }
  s.rel_l2 = safe_ratio(std::sqrt(diff2), std::sqrt(rr));
  s.rel_l1 = safe_ratio(diff1, ref1);
  s.rmse = finite > 0 ? std::sqrt(diff2 / static_cast<double>(finite)) : 0;
  return s;
}

Status compare(const TensorView& test, const TensorView& ref, ErrorStats* out) {
  FP4ATTN_RETURN_IF_ERROR(check_comparable(test, "test"));
  FP4ATTN_RETURN_IF_ERROR(check_comparable(ref, "ref"));
  bool same = test.rank == ref.rank;
  for (int i = 0; same && i < test.rank; ++i) same = test.shape[i] == ref.shape[i];
  if (!same) {
    return Status::Invalid("test: expected shape " + ref.shape_str() + " like ref, got " +
                           test.shape_str());
  }
  const std::vector<double> t = to_doubles(test), r = to_doubles(ref);
  *out = compare(t.data(), r.data(), static_cast<int64_t>(t.size()));
  return Status::Ok();
}

ErrorStats compare(const TensorView& test, const TensorView& ref) {
  ErrorStats s;
  if (!compare(test, ref, &s).ok()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.n = -1;
    s.cos = s.rel_l2 = s.rel_l1 = s.rmse = s.max_abs = nan;
  }
  return s;
}

std::string to_string(const ErrorStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "n=%lld cos=%.7g rel_l2=%.4g rel_l1=%.4g rmse=%.4g max_abs=%.4g nan_mismatch=%lld "
                "inf_mismatch=%lld",
                static_cast<long long>(s.n), s.cos, s.rel_l2, s.rel_l1, s.rmse, s.max_abs,
                static_cast<long long>(s.nan_mismatch), static_cast<long long>(s.inf_mismatch));
  return buf;
}

}  // namespace fp4attn
