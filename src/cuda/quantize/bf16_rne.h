// float -> BF16 bits as the host reference writes BF16 (float_to_bf16_bits, src/core/half.h):
// round to nearest even, a NaN quieted with its sign and top payload bits kept. Host and device,
// for every GPU quantizer output in BF16 (Q/K and V operands of the bf16 recipe, the K mean, the
// packed dequantizer).
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn::detail {

FP4ATTN_HD uint32_t bf16_rne_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return u >> 16;
}

}  // namespace fp4attn::detail
