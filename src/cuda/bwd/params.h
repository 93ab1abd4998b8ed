// Arguments of the backward kernels (docs/kernels/bwd_sm90.md): the forward's operands, O, the
// LSE, dO, the workspace and the gradients.
#pragma once

#include <cstdint>

namespace fp4attn::bwd {

struct BwdParams {
  // The forward's operands (operands.h layouts).
  const uint8_t* q;      // [b, h, s_q, d] E4M3
  const uint8_t* k;      // [b, h_kv, s_k, d] E4M3
  const uint8_t* vt;     // [b, h_kv, d, vt_pitch] E4M3, keys permuted in 16-groups
  const float* q_scale;  // [b, h, ceil(s_q / 128)]
  const float* k_scale;  // [b, h_kv, ceil(s_k / 128)]
  const float* v_scale;  // [b, h_kv, d]
  // o and dout: BSHD 16-bit, strides in elements (batch, seq, head); *_f16: FP16 else BF16.
  const uint16_t* o;
  const uint16_t* dout;
  int64_t o_stride[3], do_stride[3];
  bool o_f16, do_f16;
  const float* lse;  // [b, h, s_q] with strides (batch, head), seq stride 1
  int64_t lse_stride[2];
  // How P is rebuilt (sm90::backward_p_mode: kPExp2, kPCodes or kPDirect); the exp-free modes
  // from the forward's integer row reference m (row_max [b, h, s_q], strides as lse's).
  int p_mode;
  const float* row_max;
  int64_t row_max_stride[2];

  // Workspace.
  float* dsum;  // D [b, h, s_q] (the gradient pass: dsum_hp when DSource::kHighPrecisionO)
  // DSource::kHighPrecisionO (D_hp pass only; nullptr otherwise): D_hp [b, h, s_q], zeroed,
  // sum_j p_ij dP_ij added per (query row, CTA); dsum_hp_turn [b, h, s_q_pad / 64], zeroed, the
  // key-block turns of those adds when deterministic.
  float* dsum_hp;
  int* dsum_hp_turn;
  float* amax;    // [b * h][kAmaxSlots], zeroed before the first kernel
  uint8_t* do_v;  // [b, h, s_q_pad, d] E5M2(2^g' dO * v_scale[channel]), pad rows 0
  uint8_t* do_t;  // [b, h, d, s_q_pad] E5M2(2^g dO), queries permuted, pad 0
  uint8_t* q_t;   // [b, h, d, s_q_pad] Q's E4M3 bytes, queries permuted, pad 0
  float* dq_acc;  // [b, h, s_q, d], zeroed; real units (dS scales are per tile) / softmax_scale
  // [b, h, s_q_pad / 64, 2], zeroed: the deterministic dQ turns, one counter per (64-query block,
  // consumer warpgroup).
  int* dq_turn;

  // Gradients: BSHD, strides in elements (batch, seq, head); *_f32: FP32 else BF16.
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_stride[3], dk_stride[3], dv_stride[3];
  bool dq_f32, dk_f32, dv_f32;

  int b, h, h_kv, s_q, s_k, s_q_pad, vt_pitch;
  int key_blocks;       // ceil(s_k / 128)
  float softmax_scale;  // the forward's scale
  float scale_log2;     // softmax_scale * log2(e)
  bool causal, deterministic;
};

}  // namespace fp4attn::bwd
