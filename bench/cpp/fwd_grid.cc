#include "fwd_grid.h"

#include <algorithm>
#include <cstdio>

namespace fp4attn::bench {

std::string FwdPoint::name() const {
  char buf[96];
  if (s_k == s_q) {
    std::snprintf(buf, sizeof buf, "d%lld-s%lld", static_cast<long long>(d),
                  static_cast<long long>(s_q));
  } else {
    std::snprintf(buf, sizeof buf, "d%lld-s%lldx%lld", static_cast<long long>(d),
                  static_cast<long long>(s_q), static_cast<long long>(s_k));
  }
  return std::string(buf) + (causal ? "-causal" : "-noncausal");
}

double FwdPoint::flops() const {
  const double f = 4.0 * b * h * static_cast<double>(s_q) * static_cast<double>(s_k) * d;
  return causal ? f / 2 : f;
}

std::vector<FwdPoint> fwd_grid(bool quick, const std::vector<int64_t>& dims,
                               const std::vector<int64_t>& seqlens) {
  std::vector<int64_t> ds = dims, ss = seqlens;
  if (ds.empty()) ds = quick ? std::vector<int64_t>{128} : std::vector<int64_t>{64, 128};
  if (ss.empty()) {
    ss = quick ? std::vector<int64_t>{4096, 16384}
               : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  }
  std::vector<FwdPoint> grid;
  for (const int64_t d : ds) {
    for (const int64_t s : ss) {
      for (const bool causal : {false, true}) {
        FwdPoint p;
        p.d = d;
        p.h = p.h_kv = kFwdHidden / d;
        p.s_q = p.s_k = s;
        p.b = std::max<int64_t>(1, kFwdTokens / s);
        p.causal = causal;
        grid.push_back(p);
      }
    }
  }
  return grid;
}

FwdPoint fa3_accuracy_point() {
  FwdPoint p;
  p.b = 8;
  p.h = p.h_kv = 16;
  p.s_q = p.s_k = 2048;
  p.d = 128;
  return p;
}

}  // namespace fp4attn::bench
