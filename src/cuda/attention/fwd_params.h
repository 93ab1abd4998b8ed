// Parameters of the Hopper forward kernel, shared by the launcher (host) and
// the kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp4attn::sm90 {

constexpr int kBlockM = 128;   // query rows per CTA: two consumer warpgroups of 64
constexpr int kBlockN = 128;   // keys per pipeline stage (= the Q/K scale tile of operands.h)
constexpr int kStages = 4;     // K/V shared-memory stages
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
// PV blocks the FP8 MMA accumulates (~14-bit adds) before they are added to the FP32 O; the
// environment variable FP4ATTN_PV_PROMOTE overrides it for experiments (docs/kernels/fwd_sm90.md).
constexpr int kPromoteEvery = 4;

struct FwdParams {
  // TMA maps (3-D: innermost first). Q/K: (d, s, b*h) bytes, V^T: (s_pad, d,
  // b*h_kv).
  CUtensorMap tm_q;
  CUtensorMap tm_k;
  CUtensorMap tm_v;
  const float* q_scale;                        // [b, h, m_tiles]
  const float* k_scale;                        // [b, h_kv, n_tiles]
  const float* v_scale;                        // [b, h_kv, d]
  void* o;                                     // [b, s_q, h, d] BF16/FP16
  int64_t o_stride_b, o_stride_s, o_stride_h;  // elements
  float* lse;                                  // [b, h, s_q] or null
  int b, h, h_kv, s_q, s_k;
  int m_tiles, n_tiles;  // ceil(s_q / 128), ceil(s_k / 128)
  float scale_log2;      // softmax_scale * log2(e)
  int promote_every;     // PV blocks accumulated by the FP8 MMA before an FP32 add
  int causal;
  int out_fp16;
};

}  // namespace fp4attn::sm90
