// The paged decode kernel's parameters (filled by decode.cu on the host): the cache sides, the
// query / output views, the split plan, and the split combine's view of the partials.
#pragma once

#include <cstdint>

namespace fp4attn::paged {

// One side (K or V) of the cache, byte strides (page, token, head).
struct DecodeSide {
  const uint8_t* data;
  int64_t data_s[3];
  const uint8_t* scales;  // NVFP4 only
  int64_t scales_s[3];
  const float* global;  // s_enc (NVFP4) or the decode scale (FP8), device memory
};

// The split combine's view of the partials and the outputs (combine_partials_kernel, and the
// decode kernel's fused combine).
struct CombineParams {
  const float* o_part;
  int64_t op_s[3];  // elements: split, row, head (last dim contiguous)
  const float* lse_part;
  int64_t lp_s[3];
  int32_t splits, h, d;
  int64_t total_q;
  int32_t s_q;  // > 0: output row r is (r / s_q, r % s_q) of a rank-4 o/lse; 0: rank 3 / 2
  uint16_t* o;  // BF16
  int64_t o_sb, o_si, o_sh;
  float* lse;  // optional
  int64_t l_sb, l_si, l_sh;
};

struct DecodeParams {
  const uint16_t* q;         // BF16 bits
  int64_t q_sb, q_si, q_sh;  // elements: rank 4 (batch, token, head); varlen (row, -, head)
  int32_t s_q;               // tokens per sequence (rank-4 q); 0: varlen through cu_seqlens_q
  const int32_t* cu_seqlens_q;
  int64_t total_q;
  DecodeSide k, v;
  const int32_t* block_tables;
  int64_t bt_s0, bt_s1;
  const int32_t* seq_lens;
  int32_t page_size, page_shift;  // page_shift: log2(page_size), or -1
  bool pages16;                   // page_size % 16 == 0: a 16-key tile is inside one page
  bool k_scales_u16;  // NVFP4, d = 128: K scale address and strides even (one 16-bit load)
  bool scales_vec;    // NVFP4: both scale views' addresses and strides multiples of d/16 bytes
                      // (a token's scale row is one cp.async)
  int32_t num_pages, max_pages;
  int32_t h, group;
  float scale_log2;  // softmax_scale * log2(e)
  bool causal;
  // Split s of sequence b covers keys [s * size, (s + 1) * size): size = split_size, or with
  // split_per_seq the sequence's own ceil(seq_len / num_splits) rounded up to 64 (so one plan fits
  // every length: the schedule is computed on the device).
  int32_t split_size, num_splits, row_blocks;
  bool split_per_seq;
  int32_t* error_flag;  // optional device I32: the kPagedError* bits of bad indices are OR'd
  // Final outputs (write_partials false): o BF16, lse F32 natural log (optional).
  uint16_t* o;
  int64_t o_sb, o_si, o_sh;
  float* lse;
  int64_t l_sb, l_si, l_sh;
  // Partials (write_partials true): contiguous F32 [splits, total_q, h, d] and [splits, total_q,
  // h].
  float* o_part;
  float* lse_part;
  bool write_partials;
  // Fused combine (write_partials and counters set): the last CTA of each (sequence, kv head,
  // row block) group to finish its split merges the group's partials (comb) into o / lse.
  // counters: one int per (row, head) item, indexed by the group's first item; zero before the
  // launch, and left zero by it (each group's last arriver resets its counter).
  int32_t* counters;
  CombineParams comb;
};

}  // namespace fp4attn::paged
