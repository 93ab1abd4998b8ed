// The table of GPU quantizer calls that the quantize suite times. Each case says what it launches
// and how many bytes it must read and write at a given input shape; adding or adjusting a call
// is an edit of quantize_cases.cu alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::bench {

// The BSHD input [b, s, h, d], BF16.
struct Shape {
  int64_t b = 0, s = 0, h = 0, d = 0;
  int64_t numel() const { return b * s * h * d; }
  int64_t input_bytes() const { return 2 * numel(); }
};

// What a launch gets: the input, and an output arena of out_bytes (>= 2x the input bytes) that
// the case carves its outputs from. Each rotation slot has its own input and arena.
struct CaseIO {
  TensorView x;
  uint8_t* out = nullptr;
  size_t out_bytes = 0;
  Shape shape;
};

struct QuantizeCase {
  std::string name;          // "packed-nvfp4-rowmajor"
  std::string recipe;        // recipe or format name: "nvfp4", "mxfp4", "fp8", ...
  std::string form;          // "packed", "operand-q", "operand-k", "operand-v", "amax"
  std::string global_scale;  // "supplied", "computed", or "none" (formats without one)
  // Reads of the input the computation needs: 2 when a scale depends on a whole tensor, slice
  // or channel (an amax or max-exponent pass first), else 1.
  int passes = 1;
  // Bytes the call must move at least: the input once per pass, every output byte once.
  std::function<int64_t(const Shape&)> bytes_read, bytes_written;
  std::function<Status(const CaseIO&, cudaStream_t)> launch;
};

// Every case.
std::vector<QuantizeCase> quantize_cases();

}  // namespace fp4attn::bench
