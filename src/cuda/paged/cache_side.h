// The kernels' view of one side (K or V) of a paged cache, filled on the host from the cache's
// tensor views; shared by the paged launchers (decode.cu, prefill.cu), whose kernel parameter
// structs (DecodeSide, RepackSide) hold the same fields in their own order.
#pragma once

#include <cstdint>

#include "fp4attn/tensor.h"

namespace fp4attn::paged {

// Side: a struct with data, scales (byte pointers), data_s[3], scales_s[3] (byte strides of page,
// token, head) and global (device F32). Undefined scales (FP8) give zero strides.
template <typename Side>
Side cache_side(const TensorView& data, const TensorView& scales, const TensorView& global) {
  Side s{};
  s.data = static_cast<const uint8_t*>(data.data);
  s.scales = static_cast<const uint8_t*>(scales.data);
  for (int i = 0; i < 3; ++i) {
    s.data_s[i] = data.stride[i];
    s.scales_s[i] = scales.defined() ? scales.stride[i] : 0;
  }
  s.global = global.as<const float>();
  return s;
}

}  // namespace fp4attn::paged
