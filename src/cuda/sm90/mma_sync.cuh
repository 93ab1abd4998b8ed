// Warp-level tensor-core PTX (mma.sync and movmatrix): the register-fragment MMAs of the kernels
// that keep their operands in registers instead of shared memory (the paged decode). sm_80+.
#pragma once

#include <cstdint>

namespace fp4attn::sm90 {

// c += a b, m16n8k16, BF16 in, FP32 accumulate; a row-major A fragment, b0 / b1 the B fragment.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 8x8 16-bit matrix in the m8n8 fragment layout (lane (g, t): row g, columns 2t, 2t + 1) ->
// its transpose in the same layout.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace fp4attn::sm90
