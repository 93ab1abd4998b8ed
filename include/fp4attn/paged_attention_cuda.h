// GPU decode over the paged KV cache (issue 9): the golden paged attention (paged_kv.h) computed
// by CUDA kernels queued on `stream` (nothing synchronizes). docs/kernels/decode.md, section 7,
// has the design. Arguments mirror golden_paged_attention, so that a test passes the same views
// (in device memory) to both.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp4attn/paged_kv.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct PagedAttentionCudaOptions {
  // Host copies of the index tensors (I32, host memory, the shapes of the device ones), optional.
  // When block_tables_host and seq_lens_host are defined (and cu_seqlens_q_host for a varlen q),
  // the golden's value checks (validate_paged_indices: page ids, lengths, cu_seqlens_q) run on
  // them before any launch. Without them the values are not checked on the host, but the kernels
  // never read outside the cache: a page id outside [0, num_pages) or a seq_len outside
  // [0, max_pages * page_size] turns that sequence's output rows into NaN instead.
  TensorView block_tables_host, seq_lens_host, cu_seqlens_q_host;
  // Split-KV: 0 picks the number of splits n (paged_decode_schedule, docs/kernels/decode.md 7.1);
  // n >= 1 asks for n. Each sequence is split on the device into n parts of ceil(seq_len / n)
  // keys rounded up to 64, so one schedule serves every length up to max_len (max_len from
  // seq_lens_host when given, else max_pages * page_size; at most ceil(max_len / 64) splits).
  // 1 disables splitting.
  int num_splits = 0;
  // Device scratch for the split partials and the fused combine's arrival counters, optional: at
  // least paged_attention_workspace_bytes() bytes, 16-byte aligned. Without it the call
  // allocates (cudaMallocAsync) and frees (cudaFreeAsync) on the stream when it splits.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // true: the workspace was zeroed once (cudaMemset) and since then only used by
  // paged_attention_cuda, one call in flight at a time. Every call that completes leaves its
  // counters zero (a faulting one leaves the context unusable), so the call skips the counters'
  // cudaMemsetAsync. false: that memset runs before each split launch.
  bool workspace_is_clean = false;
  // Device I32 [1], optional: the kernels OR the kPagedError* bits (paged_kv.h) of the bad
  // lengths, page ids and cu_seqlens_q they meet into it (their rows also come out NaN).
  int32_t* error_flag = nullptr;
};

// What paged_attention_cuda launches for a batch of b sequences (total_q query rows, h heads,
// kv_heads kv heads, head_dim, the cache format), the longest query chunk max_s_q (-1: varlen
// with unknown chunks) and the longest sequence max_len, with `forced` =
// PagedAttentionCudaOptions::num_splits: the split count, the longest sequence's split size, and
// the workspace it needs. A plan made once for a batch shape (capacity max_len) holds for every
// call with those shapes whatever the lengths, since the kernel splits each sequence itself.
struct PagedDecodeSchedule {
  int64_t num_splits = 1;
  int64_t split_size = 0;
  size_t workspace_bytes = 0;
};
PagedDecodeSchedule paged_decode_schedule(int64_t b, int64_t total_q, int64_t h, int64_t kv_heads,
                                          int64_t head_dim, bool nvfp4, int64_t max_s_q,
                                          int64_t max_len, int forced);

// Decode / speculative decode over the paged cache on the GPU:
//   q: BF16 [b, s_q, h, d] or varlen [total_q, h, d] with cu_seqlens_q I32 [b + 1] (device), any
//     strides with the last dim contiguous. The query rows of a sequence that share a kv head
//     (group = h / kv_heads heads x its tokens) form blocks of 16 MMA rows; decode (s_q * group
//     <= 16) takes one block, longer chunks take several (correct, not fast: each re-reads the
//     KV range).
//   cache: NVFP4 or FP8 (paged_kv.h), device memory, head_dim 64 or 128; data views aligned for
//     the kernel's vector loads (NVFP4: address and strides multiples of head_dim / 8 bytes;
//     FP8: of 16 bytes); scale views any strides; globals read on the device (finite, > 0, or 0:
//     uncalibrated, paged_kv.h).
//   block_tables I32 [b, max_pages], seq_lens I32 [b]: device memory (host copies: options).
//   opt: softmax_scale (0: 1/sqrt(d)) and causal (bottom-right), as the golden.
//   o: BF16 like q. lse: F32 [b, h, s_q] or [h, total_q], natural log, optional; a row without
//     visible keys gets O = 0 and LSE = +inf.
// Bad shapes, dtypes, alignment or host index values: a Status naming the argument, nothing
// launched.
Status paged_attention_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                            const PagedKvCache& cache, const TensorView& block_tables,
                            const TensorView& seq_lens, const PagedAttentionOptions& opt,
                            const TensorView& o, const TensorView& lse,
                            const PagedAttentionCudaOptions& copt, cudaStream_t stream);

// The split-KV partials alone (what paged_attention_cuda merges): split s covers keys
// [s * split_size, (s + 1) * split_size), split_size a multiple of 16, or split_size 0: each
// sequence split as paged_attention_cuda splits it (num_splits parts); o_partial F32
// [num_splits, total_q, h, d] and lse_partial F32 [num_splits, total_q, h], contiguous, device
// memory; the meaning of golden_paged_attention_partials (an empty split: O = 0, LSE = -inf).
Status paged_attention_partials_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                                     const PagedKvCache& cache, const TensorView& block_tables,
                                     const TensorView& seq_lens, const PagedAttentionOptions& opt,
                                     int64_t split_size, const TensorView& o_partial,
                                     const TensorView& lse_partial,
                                     const PagedAttentionCudaOptions& copt, cudaStream_t stream);

// The LSE-weighted merge of combine_attention_partials in FP32 on the GPU: o_partial F32
// [num_splits, total_q, h, d] and lse_partial F32 [num_splits, total_q, h] (any strides, last
// dim contiguous), o BF16 [total_q, h, d], lse F32 [h, total_q] optional.
Status combine_attention_partials_cuda(const TensorView& o_partial, const TensorView& lse_partial,
                                       const TensorView& o, const TensorView& lse,
                                       cudaStream_t stream);

// Bytes of workspace paged_attention_cuda needs for num_splits splits (0 when num_splits <= 1):
// the partials and one 32-bit counter per (query row, head).
size_t paged_attention_workspace_bytes(int64_t num_splits, int64_t total_q, int64_t h, int64_t d);

// The split plan paged_attention_cuda uses: *num_splits and *split_size (keys, a multiple of 64)
// for a batch of b sequences with kv_heads heads, row_blocks 16-row blocks per (sequence, kv
// head), the longest sequence max_len, and `forced` (PagedAttentionCudaOptions::num_splits).
// ctas_per_sm: the resident CTAs per SM of the kernel that runs, paged_decode_ctas_per_sm()
// (docs/kernels/decode.md 7.9); paged_attention_cuda passes it, 2 is the 16-row d = 128 kernel's.
void paged_attention_split_plan(int64_t b, int64_t kv_heads, int64_t row_blocks, int64_t max_len,
                                int forced, int64_t* num_splits, int64_t* split_size,
                                int ctas_per_sm = 2);

// The CTAs per SM the decode kernel for this head_dim, cache format and query rows per kv head
// (group x tokens per sequence; the longest) is built for.
int paged_decode_ctas_per_sm(int64_t head_dim, bool nvfp4, int64_t rows_per_kv_head);

}  // namespace fp4attn
