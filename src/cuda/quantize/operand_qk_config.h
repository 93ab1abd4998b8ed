// Launch shape and input view of the Q/K operand kernels (operand_qk_*.cuh), shared by the
// kernels and their launchers (operand_qk.cu, operand_qk_mean.cu).
#pragma once

#include <cstdint>

namespace fp4attn::detail::qk_operand {

constexpr int kThreads = 256;                    // every Q/K kernel's CTA (block_max's warps)
constexpr int kMaxGridY = 65535;                 // slices beyond it: grid-stride over y
constexpr int64_t kMaxGridX = int64_t{1} << 30;  // blocks of a slice beyond it: grid-stride over x

// The input tensor: BSHD 16-bit values, strides in elements.
struct XArgs {
  const uint16_t* x;
  int64_t stride_b, stride_s, stride_h;
  int64_t s;
  int64_t h;
  int64_t nbh;  // b * h
};

}  // namespace fp4attn::detail::qk_operand
