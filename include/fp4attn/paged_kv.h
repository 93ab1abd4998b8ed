// The paged KV cache of one layer in NVFP4 (FP8 as the comparison point), as the GPU entry
// points (paged_kv_cuda.h, paged_attention_cuda.h, paged_prefill_cuda.h) and the host reference
// (golden/paged_kv.h) take it; docs/kernels/decode.md is the prose version.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/quantize.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

enum class KvCacheFormat { kNvfp4, kFp8 };

const char* kv_cache_format_name(KvCacheFormat f);

// The K/V cache of one layer. Every view may be strided (an engine's page pool can hold K, V and
// the scales of a page side by side), with the last dimension contiguous.
//   kNvfp4: k_data, v_data      U8 [num_pages, page_size, kv_heads, head_dim / 2]: E2M1 pairs,
//                               element 2j in the low nibble of byte j (quantize_cuda.h's packing)
//           k_scales, v_scales  U8 or E4M3 [num_pages, page_size, kv_heads, head_dim / 16]
//           k_global, v_global  F32 [1]: the encode scale s_enc, x = e2m1 * scale / s_enc
//   kFp8:   k_data, v_data      U8 or E4M3 [num_pages, page_size, kv_heads, head_dim]
//           k_scales, v_scales  undefined (TensorView{})
//           k_global, v_global  F32 [1]: the decode scale (vLLM's k_scale), x = e4m3 * scale
// A global of 0 means "not calibrated yet": the next append whose written tokens have a nonzero
// finite amax sets it from that append's data (paged_kv_calibrate_*); until then the side holds
// only zeros and non-finite values, which readers decode with factor 0 (paged_kv_decode_factor).
// Otherwise it must be finite and > 0.
struct PagedKvCache {
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  TensorView k_data, v_data;
  TensorView k_scales, v_scales;
  TensorView k_global, v_global;
  // NVFP4 block scale rule of the append. kNearest (default) is what Blackwell NVFP4 kernels and
  // their quantizers produce; every rule writes valid NVFP4 (kFourOverSix is vLLM's nvfp4_4over6).
  Nvfp4ScaleRule rule = Nvfp4ScaleRule::kNearest;
};

// The device error flags of the paged kernels (bits of an optional I32 [1] in device memory, OR'd
// by the kernels, read by the caller off the hot path). The kernels never read or write outside
// the cache: a bad value is skipped (append) or turns the sequence's output rows into NaN.
enum PagedError : int32_t {
  kPagedErrorSlotPastCache = 1,  // append: a slot >= num_pages * page_size (negative = skip)
  kPagedErrorSeqLen = 2,         // attention: a seq_len outside [0, max_pages * page_size]
  kPagedErrorPageId = 4,         // attention: a page id read outside [0, num_pages)
  kPagedErrorCuSeqlens = 8,      // attention: cu_seqlens_q outside [0, total_q] or decreasing
};
inline constexpr PagedError kPagedErrors[] = {kPagedErrorSlotPastCache, kPagedErrorSeqLen,
                                              kPagedErrorPageId, kPagedErrorCuSeqlens};

// What a flag bit means, for messages ("slot_mapping: a slot past the cache ...").
const char* paged_error_description(PagedError e);

// vLLM's slot convention: token `offset` of page `page` is slot page * page_size + offset.
constexpr int64_t paged_kv_slot(int64_t page, int64_t page_size, int64_t offset) {
  return page * page_size + offset;
}

struct PagedAttentionOptions {
  double softmax_scale = 0;  // 0 means 1/sqrt(head_dim)
  // Bottom-right aligned: query i of a sequence with s_q queries and L cached tokens sees key j
  // iff j <= i + L - s_q (the queries are the last s_q tokens, their K/V appended first).
  bool causal = true;
};

}  // namespace fp4attn
