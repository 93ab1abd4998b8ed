// Argument checks of the paged KV cache entry points (append, decode, paged prefill, combine), host
// reference and GPU dispatch alike. Two kinds: shape checks read no tensor memory (usable before
// a launch); value checks (slots, page ids, lengths) read host memory: the host reference runs
// them, a GPU entry point can run them on host copies or in a debug mode. Messages name the
// argument, e.g. "block_tables[1, 3]: page id 70 is out of range [0, 64)".
#pragma once

#include <cstdint>
#include <initializer_list>

#include "fp4attn/paged_kv.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct PagedKvShape {
  int64_t num_pages, page_size, kv_heads, head_dim;
};

// The cache views of `cache.format` (paged_kv.h): ranks, dtypes, strides (>= 0, last 1), sizes
// matching between K and V data and scales, head_dim a multiple of 16 (NVFP4) and in `allowed_d`
// (empty: any up to 512), num_pages * page_size < 2^31 (int32 slots), non-null data, k_global
// and v_global F32 [1]. `writable`: the data and scale views are outputs (no stride 0 on a
// dimension of size > 1).
Status validate_paged_kv_cache(const PagedKvCache& cache, std::initializer_list<int> allowed_d,
                               bool writable, PagedKvShape* shape);

// k, v [num_tokens, kv_heads, head_dim] (BF16/FP16/F32) matching the cache; slot_mapping I32 or
// I64 [num_tokens] (vLLM passes int64). Fills *num_tokens.
Status validate_paged_append(const TensorView& k, const TensorView& v,
                             const TensorView& slot_mapping, const PagedKvShape& kv,
                             int64_t* num_tokens);

// Slot i of an I32 or I64 slot_mapping (host memory), read at its full width.
int64_t slot_at(const TensorView& slot_mapping, int64_t i);

// Slot values (host memory): < num_pages * page_size; negative = skipped; no slot twice.
Status validate_slot_values(const TensorView& slot_mapping, const PagedKvShape& kv);

// A stored global scale: finite and > 0, or 0 (uncalibrated: readers decode its side with factor
// 0, paged_kv_decode_factor; the next append with nonzero data calibrates it).
Status validate_global_scale(float value, const char* name);

struct PagedQueryShape {
  int64_t b, total_q, h, d, max_pages;
  int64_t s_q;  // rank-4 q only (uniform); -1 for varlen
  bool varlen;
};

// q [b, s_q, h, d] or [total_q, h, d] + cu_seqlens_q I32 [b + 1]; block_tables I32
// [b, max_pages]; seq_lens I32 [b]; o like q; lse [b, h, s_q] or [h, total_q] (optional);
// h a multiple of kv_heads, d equal to the cache's. o and lse undefined: not checked (partials).
Status validate_paged_attention(const TensorView& q, const TensorView& cu_seqlens_q,
                                const TensorView& block_tables, const TensorView& seq_lens,
                                const TensorView& o, const TensorView& lse, const PagedKvShape& kv,
                                PagedQueryShape* shape);

// Values (host memory): seq_lens in [0, max_pages * page_size]; the page ids a sequence reads
// (its first ceil(seq_len / page_size) entries) in [0, num_pages); cu_seqlens_q starting at 0,
// non-decreasing, ending at total_q.
Status validate_paged_indices(const TensorView& cu_seqlens_q, const TensorView& block_tables,
                              const TensorView& seq_lens, const PagedKvShape& kv,
                              const PagedQueryShape& qs);

// Split-KV partials: o_partial [num_splits, total_q, h, d] and lse_partial
// [num_splits, total_q, h], float dtypes in `allowed`; `writable` for outputs.
Status validate_partials(const TensorView& o_partial, const TensorView& lse_partial,
                         std::initializer_list<DType> allowed, bool writable);

}  // namespace fp4attn
