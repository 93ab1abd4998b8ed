// The forward kernel's P dump (testing only, instantiated in fwd_dump_p.cu): after each key
// block's pack, every thread writes the E4M3 bytes of its PV A-operand registers and its rows'
// running reference to global memory, in the layout of fwd_dump_p.h.
#pragma once

#include <cstdint>

#include "cuda/fwd/config.h"
#include "cuda/fwd/params.h"
#include "fp4attn/operands.h"

namespace fp4attn::sm90 {

struct PDump {
  static constexpr bool kOn = true;
  uint8_t* p;          // [b * h, s_q, key_stride] P bytes in real key order
  float* m;            // [b * h, s_q, blocks] running reference after each block's update
  int64_t key_stride;  // blocks * N
  int blocks;          // ceil(s_k / N)

  // Block j of rows[0..1] (the thread's rows r0 and r0 + 8). The bytes are read from the A
  // operand registers as the wgmma consumes them, not from the FP32 values: register r of k-step
  // kk holds row r0 + 8 (r & 1) at K positions 32 kk + 16 (r >> 1) + 4 t + {0..3} (the FP8 A
  // fragment), and K position q of the block multiplies the V^T column that holds key
  // operand_v_key_at(q). So a wrong pack order shows up as P at the wrong key.
  template <int N, int PS>
  __device__ void block(const FwdParams& prm, int bh, const int (&rows)[2], int t, int j,
                        const uint32_t (&pa)[PS][4], const float (&m_run)[2]) const {
    static_assert(PS * 32 == N, "one A-operand k-step per 32 keys");
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rows[h2] >= prm.s_q) continue;
      const int64_t row = int64_t(bh) * prm.s_q + rows[h2];
      uint8_t* dst = p + row * key_stride + int64_t(j) * N;
#pragma unroll
      for (int kk = 0; kk < PS; ++kk) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const uint32_t word = pa[kk][2 * hi + h2];
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            dst[operand_v_key_at(32 * kk + 16 * hi + 4 * t + b)] = uint8_t(word >> (8 * b));
          }
        }
      }
      if (t == 0) m[row * blocks + j] = m_run[h2];
    }
  }
};

}  // namespace fp4attn::sm90
