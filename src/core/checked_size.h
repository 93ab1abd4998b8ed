// Checked size arithmetic: products and sums of user-given sizes (b * s * h * d, bytes) in int64
// with overflow detected, so that a size that wraps becomes an error naming its factors instead
// of a small allocation that is then written past (issue 26). The one home of this arithmetic
// for the harness (src/harness) and the CLI (tools/).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "fp4attn/status.h"

namespace fp4attn {

// a * b and a + b for a, b >= 0: false (out untouched) when a term is negative or the result
// exceeds INT64_MAX.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// One factor of a size, named as the caller's user knows it ("--batch", "b").
struct SizeFactor {
  const char* name;
  int64_t value;
};

// The product of `factors` (1 when empty). An error when a factor is negative or the product
// exceeds INT64_MAX, naming every factor and `what` is the product's meaning, e.g.
// "q elements: --batch * --seqlen-q * --heads * --head-dim = 1048576 * 33554432 * 4096 * 128
// overflows int64".
inline Status checked_product(const char* what, std::initializer_list<SizeFactor> factors,
                              int64_t* out) {
  int64_t p = 1;
  bool ok = true, negative = false;
  for (const SizeFactor& f : factors) {
    negative = negative || f.value < 0;
    ok = ok && checked_mul(p, f.value, &p);
  }
  if (ok) {
    *out = p;
    return Status::Ok();
  }
  std::string names, values;
  for (const SizeFactor& f : factors) {
    names += (names.empty() ? "" : " * ") + std::string(f.name);
    values += (values.empty() ? "" : " * ") + std::to_string(f.value);
  }
  return Status::Invalid(std::string(what) + ": " + names + " = " + values +
                         (negative ? " has a negative factor" : " overflows int64"));
}

// Human-readable bytes for messages: "1.50 GiB".
inline std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// The most host memory one problem of the harness or the CLI may ask for: the machine's physical
// memory, or FP4ATTN_HOST_MEMORY_LIMIT (bytes) when that is a smaller positive integer. A request
// above it is refused up front (with overcommit, a larger one would be granted and the process
// killed part way through filling it).
inline int64_t host_memory_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t limit = INT64_MAX;
  if (pages > 0 && page > 0 && !checked_mul(pages, page, &limit)) limit = INT64_MAX;
  if (const char* env = std::getenv("FP4ATTN_HOST_MEMORY_LIMIT")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v < limit) limit = v;
  }
  return limit;
}

// An error when `bytes` of host memory for `what` exceed host_memory_limit(), e.g.
// "--batch, --seqlen-q, --heads: the host buffers need 96.00 GiB, more than the 62.80 GiB of
// host memory (FP4ATTN_HOST_MEMORY_LIMIT lowers the limit)".
inline Status check_host_bytes(const std::string& what, int64_t bytes) {
  const int64_t limit = host_memory_limit();
  if (bytes <= limit) return Status::Ok();
  return Status::Invalid(what + ": the host buffers need " + format_bytes(bytes) +
                         ", more than the " + format_bytes(limit) +
                         " of host memory allowed (physical memory, or FP4ATTN_HOST_MEMORY_LIMIT)");
}

}  // namespace fp4attn
