// Parameters of the Hopper forward kernel, shared by the launcher (host) and the kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp4attn::sm90 {

struct FwdParams {
  // TMA maps (3-D: innermost first). Q/K: (d, s, b*h) bytes, V^T: (s_pad, d,
  // b*h_kv).
  CUtensorMap tm_q;
  CUtensorMap tm_k;
  CUtensorMap tm_v;
  // O as (d, s_q, h, b) 2-byte elements in 64 x 64 boxes with the 128-byte swizzle; used when
  // o_tma (O's strides and base allow TMA), else the epilogue stores from registers.
  CUtensorMap tm_o;
  int o_tma;
  const float* q_scale;                        // [b, h, m_tiles]
  const float* k_scale;                        // [b, h_kv, n_tiles]
  const float* v_scale;                        // [b, h_kv, d]
  void* o;                                     // [b, s_q, h, d] BF16/FP16
  int64_t o_stride_b, o_stride_s, o_stride_h;  // elements
  float* lse;                                  // [b, h, s_q] (row stride 1) or null
  int64_t lse_stride_b, lse_stride_h;          // elements
  // The integer log2 reference m of each row (-inf without keys), which the exp-free recipes'
  // backward rebuilds P from: [b, h, s_q] (row stride 1) or null.
  float* row_max;
  int64_t row_max_stride_b, row_max_stride_h;
  int b, h, h_kv, s_q, s_k;
  int m_tiles, n_tiles;  // ceil(s_q / 128), ceil(s_k / 128)
  float scale_log2;      // softmax_scale * log2(e)
  int causal;
  int out_fp16;
};

}  // namespace fp4attn::sm90
