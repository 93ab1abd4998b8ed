// libFuzzer target: the Blackwell 128x4 swizzled scale layout (include/fp4attn/scale_layout.h,
// src/formats/scale_layout.cc). Input: [rows: 2][sf_cols: 1][probe row: 4][probe col: 3] then
// scale bytes. Invariants, a trap when broken:
//  * swizzled_scale_offset is a bijection from the padded [rows128, cols4] grid onto
//    [0, swizzled_scale_bytes), and the atom decomposition of an offset gives its (row, col) back;
//  * scales_to_swizzled then scales_from_swizzled returns the input, and the padding is zero;
//  * on huge shapes (up to 2^31 rows, 2^20 columns) a probed offset lies inside the buffer and
//    inverts to the probe.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fp4attn/scale_layout.h"
#include "fuzz/fuzz_check.h"

namespace fp4attn {
namespace {

struct Cell {
  int64_t row, col;
};

// The layout's definition read backwards: atom = offset / 512 gives (row / 128, col / 4) with
// column atoms fastest; inside the atom, (row % 32) * 16 + ((row / 32) % 4) * 4 + col % 4.
Cell invert(int64_t offset, int64_t sf_cols) {
  const int64_t col_atoms = (sf_cols + 3) / 4;
  const int64_t atom = offset / 512, in = offset % 512;
  const int64_t row = atom / col_atoms * 128 + (in % 16) / 4 * 32 + in / 16;
  const int64_t col = atom % col_atoms * 4 + in % 4;
  return {row, col};
}

}  // namespace
}  // namespace fp4attn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fp4attn;
  if (size < 11) return 0;
  // Up to 640 rows and 40 scale columns (2560 FP4 values per row): several atoms both ways.
  const int64_t rows = 1 + (data[0] | (data[1] << 8)) % 640;
  const int64_t sf_cols = 1 + data[2] % 40;
  const int64_t padded_rows = (rows + 127) / 128 * 128, padded_cols = (sf_cols + 3) / 4 * 4;
  const int64_t bytes = swizzled_scale_bytes(rows, sf_cols);
  FUZZ_CHECK(bytes == padded_rows * padded_cols);

  std::vector<uint8_t> seen(bytes, 0);
  for (int64_t m = 0; m < padded_rows; ++m) {
    for (int64_t k = 0; k < padded_cols; ++k) {
      const int64_t off = swizzled_scale_offset(m, k, sf_cols);
      FUZZ_CHECK(off >= 0 && off < bytes);
      FUZZ_CHECK(seen[off] == 0);  // injective, so (same size) onto
      seen[off] = 1;
      const Cell c = invert(off, sf_cols);
      FUZZ_CHECK(c.row == m && c.col == k);
    }
  }

  // Round trip of fuzzed bytes through buffers of exactly the documented sizes (ASan checks
  // that nothing outside them is touched); the output starts non-zero to see the padding.
  std::vector<uint8_t> row_major(rows * sf_cols);
  for (int64_t i = 0; i < rows * sf_cols; ++i) row_major[i] = data[10 + i % (size - 10)] ^ i;
  std::vector<uint8_t> swizzled(bytes, 0xA5), back(rows * sf_cols, 0x5A);
  scales_to_swizzled(row_major.data(), rows, sf_cols, swizzled.data());
  scales_from_swizzled(swizzled.data(), rows, sf_cols, back.data());
  FUZZ_CHECK(back == row_major);
  for (int64_t off = 0; off < bytes; ++off) {
    const Cell c = invert(off, sf_cols);
    if (c.row >= rows || c.col >= sf_cols) FUZZ_CHECK(swizzled[off] == 0);
  }

  // One probe on a huge shape: the formula's int64 arithmetic and the inverse still agree.
  const int64_t big_rows = 1 + ((static_cast<int64_t>(data[3]) | data[4] << 8 | data[5] << 16 |
                                 static_cast<int64_t>(data[6] & 0x7F) << 24));
  const int64_t big_cols = 1 + (data[7] | data[8] << 8 | (data[9] & 0xF) << 16);
  const int64_t pr = (static_cast<int64_t>(data[5]) << 16 | data[4] << 8 | data[3]) % big_rows;
  const int64_t pc = (data[9] << 8 | data[8]) % big_cols;
  const int64_t off = swizzled_scale_offset(pr, pc, big_cols);
  FUZZ_CHECK(off >= 0 && off < swizzled_scale_bytes(big_rows, big_cols));
  const Cell c = invert(off, big_cols);
  FUZZ_CHECK(c.row == pr && c.col == pc);
  return 0;
}
