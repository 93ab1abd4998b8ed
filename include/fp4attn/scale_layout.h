// Blackwell "128x4" swizzled layout of block-scale bytes (cuBLASLt, CUTLASS, FlashInfer):
// 512-byte atoms of 128 rows x 4 scale columns, intra-atom byte offset
// (m % 32) * 16 + ((m / 32) % 4) * 4 + (k % 4); atom index (m / 128) * ceil(sf_cols / 4) + k / 4
// (scale-column atoms vary fastest); rows padded to 128 and scale columns to 4, padding zero.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"

namespace fp4attn {

// Bytes of the swizzled buffer: rows rounded up to 128 times sf_cols rounded up to 4.
inline int64_t swizzled_scale_bytes(int64_t rows, int64_t sf_cols) {
  return (rows + 127) / 128 * 128 * ((sf_cols + 3) / 4 * 4);
}

// Byte offset of scale (row, sf_col) in a swizzled buffer of sf_cols scale columns.
FP4ATTN_HD int64_t swizzled_scale_offset(int64_t row, int64_t sf_col, int64_t sf_cols) {
  const int64_t col_atoms = (sf_cols + 3) / 4;
  const int64_t atom = (row / 128) * col_atoms + sf_col / 4;
  return atom * 512 + (row % 32) * 16 + ((row / 32) % 4) * 4 + (sf_col % 4);
}

// Row-major [rows, sf_cols] scales -> swizzled (swizzled_scale_bytes bytes, padding zeroed).
void scales_to_swizzled(const uint8_t* row_major, int64_t rows, int64_t sf_cols, uint8_t* out);
// Swizzled -> row-major [rows, sf_cols] (the padding is not read).
void scales_from_swizzled(const uint8_t* swizzled, int64_t rows, int64_t sf_cols, uint8_t* out);

}  // namespace fp4attn
