// The paged prefill gather/repack kernel's parameters and launcher (prefill_repack.cu), called by
// paged_prefill_repack_cuda (prefill.cu) after its checks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4attn/status.h"

namespace fp4attn::paged {

// Sequences per launch: their prefix sums travel in the kernel parameters (3 x 257 int32, inside
// the classic 4 KB parameter limit); longer batches take several launches.
constexpr int kRepackMaxSeqs = 256;
constexpr int kRepackTileTokens = 128;  // tokens per CTA = the operands' scale tile
constexpr int kRepackThreads = 256;

struct RepackSide {
  const uint8_t* data;    // [num_pages, page_size, kv_heads, d / 2] (NVFP4) or [.., d] (FP8)
  const uint8_t* scales;  // NVFP4: [num_pages, page_size, kv_heads, d / 16]; FP8: null
  int64_t data_s[3], scales_s[3];  // byte strides of page, token, head
  const float* global;             // device: s_enc (NVFP4) or the decode scale (FP8)
};

struct RepackParams {
  RepackSide k, v;
  const int32_t* block_tables;  // device, row `bt_row0 + i` belongs to sequence i of the launch
  int64_t bt_s0, bt_s1, bt_row0;
  int32_t page_size, num_pages, kv_heads, nseq;
  // Outputs at the launch's first sequence (layout of paged_prefill.h).
  uint8_t* k_out;
  float* k_scale_out;
  uint8_t* v_out;
  float* v_scale_out;
  // Prefix sums over the launch's sequences, from 0: 128-token tiles (= K scale tiles), tokens
  // (cu_seqlens_k) and V pitches (tokens rounded up to 16).
  int32_t cu_tiles[kRepackMaxSeqs + 1];
  int32_t cu_k[kRepackMaxSeqs + 1];
  int32_t cu_v[kRepackMaxSeqs + 1];
};

// One launch: grid (cu_tiles[nseq], kv_heads). d is 64 or 128.
Status launch_prefill_repack(const RepackParams& p, bool fp4, int d, cudaStream_t stream);

}  // namespace fp4attn::paged
