// Host tensor helpers of quantize.h: row-wise NVFP4/MXFP4 quantization and E2M1 packing.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

// Runs f(begin, end) over [0, rows) split into contiguous chunks, one thread per chunk, when the
// work is large enough to pay for the threads.
template <typename F>
void for_row_ranges(int64_t rows, int64_t elements_per_row, F f) {
  constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t by_work = rows * elements_per_row / kMinElementsPerThread;
  const int64_t threads = std::clamp<int64_t>(by_work, 1, std::min(hw, std::max<int64_t>(rows, 1)));
  if (threads <= 1) {
    f(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const int64_t chunk = (rows + threads - 1) / threads;
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    pool.emplace_back(f, begin, std::min(rows, begin + chunk));
  }
  for (std::thread& t : pool) t.join();
}

// Quantizes rows [begin, end) block by block with quantize_block(x, n, codes) -> scale code.
template <typename Q>
void quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, int block,
                   uint8_t* codes, uint8_t* scales, Q quantize_block) {
  const int64_t blocks = (cols + block - 1) / block;
  for_row_ranges(rows, cols, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t c0 = b * block;
        const int n = static_cast<int>(std::min<int64_t>(block, cols - c0));
        scales[r * blocks + b] = quantize_block(x + r * ld + c0, n, codes + r * cols + c0);
      }
    }
  });
}

}  // namespace

void nvfp4_quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, float s_enc,
                         Nvfp4ScaleRule rule, uint8_t* codes, uint8_t* scales) {
  quantize_rows(x, rows, cols, ld, kNvfp4Block, codes, scales,
                [=](const float* xb, int n, uint8_t* cb) {
                  return nvfp4_quantize_block(xb, n, s_enc, rule, cb);
                });
}

void mxfp4_quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, MxScaleRule rule,
                         uint8_t* codes, uint8_t* scales) {
  quantize_rows(
      x, rows, cols, ld, kMxfp4Block, codes, scales,
      [=](const float* xb, int n, uint8_t* cb) { return mxfp4_quantize_block(xb, n, rule, cb); });
}

void pack_e2m1_rows(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed) {
  const int64_t bytes = rows * (cols / 2);
  for (int64_t j = 0; j < bytes; ++j) packed[j] = pack_e2m1x2(codes[2 * j], codes[2 * j + 1]);
}

void unpack_e2m1_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* codes) {
  const int64_t bytes = rows * (cols / 2);
  for (int64_t j = 0; j < bytes; ++j) {
    codes[2 * j] = e2m1x2_first(packed[j]);
    codes[2 * j + 1] = e2m1x2_second(packed[j]);
  }
}

}  // namespace fp4attn
