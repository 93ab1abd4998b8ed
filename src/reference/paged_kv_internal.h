// Shared by the paged KV cache's host reference files: token addressing and decoding.
#pragma once

#include <cstdint>

#include "fp4attn/golden/paged_kv.h"

namespace fp4attn::paged_internal {

// Byte offset of (page, offset, kv head, 0) in a cache view of one-byte elements.
inline int64_t token_offset(const TensorView& t, int64_t page, int64_t offset, int64_t head) {
  return page * t.stride[0] + offset * t.stride[1] + head * t.stride[2];
}

// Decodes the d values of one cached token of one kv head (K when !is_v) into out, as the codec
// defines them (paged_kv_decode_*). `global` is the side's global scale; an uncalibrated one (0)
// multiplies the values by 0 instead (paged_kv_decode_factor: zero stays 0, NaN stays NaN).
inline void decode_token(const PagedKvCache& c, bool is_v, int64_t page, int64_t offset,
                         int64_t head, int64_t d, float global, float* out) {
  const TensorView& data = is_v ? c.v_data : c.k_data;
  const uint8_t* p = data.as<const uint8_t>() + token_offset(data, page, offset, head);
  if (c.format == KvCacheFormat::kFp8) {
    for (int64_t i = 0; i < d; ++i) out[i] = paged_kv_decode_fp8(p[i], global);  // 0: factor 0
    return;
  }
  const TensorView& sc = is_v ? c.v_scales : c.k_scales;
  const uint8_t* s = sc.as<const uint8_t>() + token_offset(sc, page, offset, head);
  if (global == 0.f) {  // e2m1 * scale times the global's multiplier, 0
    for (int64_t i = 0; i < d; ++i) {
      out[i] = detail::mul_rn(paged_kv_decode_nvfp4(p, s, static_cast<int>(i), 1.f), 0.f);
    }
    return;
  }
  for (int64_t i = 0; i < d; ++i) out[i] = paged_kv_decode_nvfp4(p, s, static_cast<int>(i), global);
}

inline float read_global(const TensorView& g) { return *g.as<const float>(); }

}  // namespace fp4attn::paged_internal
