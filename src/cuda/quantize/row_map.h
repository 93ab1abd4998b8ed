// 64-bit division by a runtime constant (FastDiv) and the row map of a BSHD tensor built on it
// (RowMap): the index math of the packed-storage kernels. Host and device.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"

namespace fp4attn::packed {

// n / d for n < 2^63 and 1 <= d < 2^62 (Granlund-Montgomery: m = floor(2^64 (2^l - d) / d) + 1, l =
// ceil(log2 d), q = (umulhi(m, n) + n) >> l; the sum cannot overflow for n < 2^63).
struct FastDiv {
  uint64_t d = 1, m = 1;
  int l = 0;

  static FastDiv make(uint64_t divisor) {
    FastDiv f;
    f.d = divisor < 1 ? 1 : divisor;
    f.l = 0;
    while (f.l < 62 && (uint64_t{1} << f.l) < f.d) ++f.l;
    const unsigned __int128 num = static_cast<unsigned __int128>((uint64_t{1} << f.l) - f.d) << 64;
    f.m = static_cast<uint64_t>(num / f.d) + 1;
    return f;
  }

  FP4ATTN_HD uint64_t div(uint64_t n) const {
#if defined(__CUDA_ARCH__)
    const uint64_t t = __umul64hi(m, n);
#else
    const uint64_t t = static_cast<uint64_t>((static_cast<unsigned __int128>(m) * n) >> 64);
#endif
    return (t + n) >> l;
  }
};

// Element offset of row r of a BSHD tensor viewed as rows = b * s * h rows of d values.
struct RowMap {
  FastDiv div_h, div_s;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;

  FP4ATTN_HD int64_t offset(int64_t r) const {
    const uint64_t bs = div_h.div(static_cast<uint64_t>(r));
    const int64_t hi = r - static_cast<int64_t>(bs * div_h.d);
    const uint64_t bi = div_s.div(bs);
    const int64_t si = static_cast<int64_t>(bs - bi * div_s.d);
    return static_cast<int64_t>(bi) * stride_b + si * stride_s + hi * stride_h;
  }
};

}  // namespace fp4attn::packed
