// Converters between row-major block scales and the Blackwell 128x4 swizzled layout.
#include "fp4attn/scale_layout.h"

#include <cstring>

namespace fp4attn {

void scales_to_swizzled(const uint8_t* row_major, int64_t rows, int64_t sf_cols, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>(swizzled_scale_bytes(rows, sf_cols)));
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < sf_cols; ++k) {
      out[swizzled_scale_offset(m, k, sf_cols)] = row_major[m * sf_cols + k];
    }
  }
}

void scales_from_swizzled(const uint8_t* swizzled, int64_t rows, int64_t sf_cols, uint8_t* out) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < sf_cols; ++k) {
      out[m * sf_cols + k] = swizzled[swizzled_scale_offset(m, k, sf_cols)];
    }
  }
}

}  // namespace fp4attn
