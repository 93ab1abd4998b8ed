// Seeded input suite. Counter-based generation (hash of seed, stream and element index) instead of
// a sequential RNG: any element can be computed alone, so generation is parallel and prefixes of
// larger shapes are reproducible.
#include "harness/suite.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "core/checked_size.h"
#include "core/parallel.h"

namespace fp4attn {
namespace {

// Independent random streams; a value is hash(seed, stream, index).
enum Stream : uint64_t {
  kStreamQ = 1,
  kStreamK = 2,
  kStreamV = 3,
  kStreamKeyMean = 4,   // outliers: per-head key mean
  kStreamSinkDir = 5,   // large-logits: the sink direction u per kv head
  kStreamQueryAmp = 6,  // large-logits: the size of a query's component along u
  kStreamPeak = 7,      // large-logits: which rows are peaked, and on which key
};

constexpr int64_t kSinkPeriod = 256;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// Uniform in (0, 1) from the top 53 bits: never 0, so log() below is finite.
double uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(hash(seed, stream, index) >> 11) + 0.5) * 0x1p-53;
}

// Box-Muller (cosine branch only): our own, since std::normal_distribution differs between
// standard libraries. log/cos/sqrt in double may differ by an ulp across libms, which changes the
// BF16-rounded value only at an exact rounding tie.
double normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform(seed, stream, 2 * index), u2 = uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Heavy-tailed: a Gaussian with a log-normal scale (kurtosis ~ 3 e).
double heavy(uint64_t seed, uint64_t stream, uint64_t index) {
  return normal(seed, stream, 2 * index) * std::exp(0.5 * normal(seed, stream, 2 * index + 1));
}

// Round to the nearest BF16 value (8 significant bits, ties to even) straight from double, so
// there is no double rounding through float.
double round_to_bf16(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

// Outlier channels of the kOutlierChannels kind; returns the index 0..3 or -1.
int outlier_index(int64_t c, int64_t d) {
  for (int i = 0; i < 4; ++i) {
    if (c == (2 * i + 1) * d / 8) return i;
  }
  return -1;
}

// Fills a contiguous [b][s][heads][d] tensor; row(batch, pos, head, row_index, out) writes the d
// unrounded values of one row. Rows are independent, so they are generated in parallel.
template <typename F>
void fill_rows(std::vector<float>* t, int64_t b, int64_t s, int64_t heads, int64_t d, F row) {
  t->assign(b * s * heads * d, 0.0f);  // the caller checked the product (suite_sizes)
  parallel_for(b * s * heads, [&](int64_t r) {
    std::vector<double> vals(d);
    row(r / heads / s, (r / heads) % s, r % heads, r, vals.data());
    for (int64_t c = 0; c < d; ++c) (*t)[r * d + c] = static_cast<float>(round_to_bf16(vals[c]));
  });
}

}  // namespace

const char* input_kind_name(InputKind kind) {
  switch (kind) {
    case InputKind::kGaussian:
      return "gaussian";
    case InputKind::kOutlierChannels:
      return "outliers";
    case InputKind::kLargeLogits:
      return "large-logits";
    case InputKind::kNearUniform:
      return "near-uniform";
  }
  return "unknown";
}

double suite_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  return normal(seed, stream, index);
}

bool parse_input_kind(std::string_view name, InputKind* out) {
  for (InputKind kind : kAllInputKinds) {
    if (name == input_kind_name(kind)) {
      *out = kind;
      return true;
    }
  }
  return false;
}

Status suite_sizes(int64_t b, int64_t s_q, int64_t s_k, int64_t h, int64_t h_kv, int64_t d,
                   SuiteSizes* out) {
  b = std::max<int64_t>(b, 0), s_q = std::max<int64_t>(s_q, 0), s_k = std::max<int64_t>(s_k, 0);
  h = std::max<int64_t>(h, 0), h_kv = std::max<int64_t>(h_kv, 0), d = std::max<int64_t>(d, 0);
  SuiteSizes z{};
  int64_t dirs = 0, kv2 = 0, all = 0;
  FP4ATTN_RETURN_IF_ERROR(
      checked_product("q elements", {{"b", b}, {"s_q", s_q}, {"h", h}, {"d", d}}, &z.q_elements));
  FP4ATTN_RETURN_IF_ERROR(checked_product(
      "k and v elements", {{"b", b}, {"s_k", s_k}, {"h_kv", h_kv}, {"d", d}}, &z.kv_elements));
  FP4ATTN_RETURN_IF_ERROR(checked_product("sink directions", {{"h_kv", h_kv}, {"d", d}}, &dirs));
  const std::string what = "suite inputs q, k, v (b, s_q, s_k, h, h_kv, d = " + std::to_string(b) +
                           ", " + std::to_string(s_q) + ", " + std::to_string(s_k) + ", " +
                           std::to_string(h) + ", " + std::to_string(h_kv) + ", " +
                           std::to_string(d) + ")";
  if (!checked_mul(z.kv_elements, 2, &kv2) || !checked_add(z.q_elements, kv2, &all) ||
      !checked_mul(all, int64_t(sizeof(float)), &z.bytes)) {
    return Status::Invalid(what + ": the byte count overflows int64");
  }
  FP4ATTN_RETURN_IF_ERROR(check_host_bytes(what, z.bytes));
  *out = z;
  return Status::Ok();
}

SuiteInputs make_inputs(InputKind kind, int64_t b, int64_t s_q, int64_t s_k, int64_t h,
                        int64_t h_kv, int64_t d, uint64_t seed) {
  b = std::max<int64_t>(b, 0), s_q = std::max<int64_t>(s_q, 0), s_k = std::max<int64_t>(s_k, 0);
  h = std::max<int64_t>(h, 0), h_kv = std::max<int64_t>(h_kv, 0), d = std::max<int64_t>(d, 0);
  // A wrapped product would allocate a small buffer and write past it (issue 26).
  SuiteSizes sizes{};
  if (const Status st = suite_sizes(b, s_q, s_k, h, h_kv, d, &sizes); !st.ok()) {
    throw std::length_error("make_inputs: " + st.message());
  }
  SuiteInputs in{{}, {}, {}, b, s_q, s_k, h, h_kv, d};
  // kv head read by query head `head`, kept in range even when h_kv does not divide h.
  const int64_t group = h_kv > 0 ? std::max<int64_t>(1, h / h_kv) : 1;
  auto kv_head_of = [&](int64_t head) {
    return std::min(head / group, std::max<int64_t>(h_kv - 1, 0));
  };

  // Large-logits: one unit direction per kv head, shared by its sink keys and its queries.
  std::vector<double> sink_dir(std::max<int64_t>(h_kv, 1) * d, 0.0);
  if (kind == InputKind::kLargeLogits) {
    for (int64_t kvh = 0; kvh < h_kv; ++kvh) {
      double* u = &sink_dir[kvh * d];
      double norm2 = 0;
      for (int64_t c = 0; c < d; ++c) {
        u[c] = normal(seed, kStreamSinkDir, kvh * d + c);
        norm2 += u[c] * u[c];
      }
      for (int64_t c = 0; c < d; ++c) u[c] /= std::sqrt(norm2);
    }
  }

  // One key row before rounding; the peaked queries of large-logits are built from it.
  auto key_row = [&](int64_t, int64_t pos, int64_t kvh, int64_t row, double* out) {
    for (int64_t c = 0; c < d; ++c) {
      const uint64_t e = row * d + c;
      switch (kind) {
        case InputKind::kGaussian:
        case InputKind::kNearUniform:
          out[c] = normal(seed, kStreamK, e);
          break;
        case InputKind::kOutlierChannels: {
          // Outlier channels: a large mean with modest spread (what K smoothing removes).
          const int o = outlier_index(c, d);
          if (o >= 0) {
            out[c] = (o % 2 ? -20.0 : 20.0) + 0.5 * heavy(seed, kStreamK, e);
          } else {
            out[c] = 0.5 * normal(seed, kStreamKeyMean, kvh * d + c) + heavy(seed, kStreamK, e);
          }
          break;
        }
        case InputKind::kLargeLogits:
          out[c] = normal(seed, kStreamK, e);
          if (pos % kSinkPeriod == 0) out[c] += 150.0 * sink_dir[kvh * d + c];
          break;
      }
    }
  };

  auto value_row = [&](int64_t, int64_t, int64_t, int64_t row, double* out) {
    for (int64_t c = 0; c < d; ++c) {
      const uint64_t e = row * d + c;
      out[c] = kind == InputKind::kOutlierChannels ? heavy(seed, kStreamV, e)
                                                   : normal(seed, kStreamV, e);
    }
  };

  auto query_row = [&](int64_t batch, int64_t, int64_t head, int64_t row, double* out) {
    for (int64_t c = 0; c < d; ++c) {
      const uint64_t e = row * d + c;
      switch (kind) {
        case InputKind::kGaussian:
          out[c] = normal(seed, kStreamQ, e);
          break;
        case InputKind::kNearUniform:
          out[c] = 0.01 * normal(seed, kStreamQ, e);
          break;
        case InputKind::kOutlierChannels:
          out[c] = (outlier_index(c, d) >= 0 ? 10.0 : 1.0) * heavy(seed, kStreamQ, e);
          break;
        case InputKind::kLargeLogits:
          out[c] = normal(seed, kStreamQ, e);
          break;
      }
    }
    if (kind != InputKind::kLargeLogits) return;
    const int64_t kvh = kv_head_of(head);
    const double* u = &sink_dir[kvh * d];
    const uint64_t peak = hash(seed, kStreamPeak, row);
    if (peak % 8 == 0 && s_k > 0) {
      // Peaked row: nearly parallel to one key, with the sink direction removed.
      int64_t j = static_cast<int64_t>((peak >> 3) % static_cast<uint64_t>(s_k));
      if (j % kSinkPeriod == 0 && j + 1 < s_k) ++j;
      std::vector<double> key(d);
      key_row(batch, j, kvh, (batch * s_k + j) * h_kv + kvh, key.data());
      double along = 0;
      for (int64_t c = 0; c < d; ++c) along += key[c] * u[c];
      for (int64_t c = 0; c < d; ++c) out[c] = 1.5 * (key[c] - along * u[c]) + 0.1 * out[c];
    } else {
      // Ordinary row: a component along the sink direction gives sink logits ~150.
      const double amp =
          std::sqrt(static_cast<double>(d)) * (1.0 + 0.2 * normal(seed, kStreamQueryAmp, row));
      for (int64_t c = 0; c < d; ++c) out[c] += amp * u[c];
    }
  };

  fill_rows(&in.k, b, s_k, h_kv, d, key_row);
  fill_rows(&in.v, b, s_k, h_kv, d, value_row);
  fill_rows(&in.q, b, s_q, h, d, query_row);
  return in;
}

}  // namespace fp4attn
