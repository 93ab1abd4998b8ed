// The paged KV cache's host reference: the append through a slot mapping, the decoded cache,
// the golden paged attention (decode, speculative decode, prefill/extend), split-KV partials
// and their combine. The GPU attention is checked against it.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/paged_kv_codec.h"
#include "fp4attn/paged_kv.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

// ---- Host reference (src/reference/paged_kv_*.cc) ----------------------------------------------

// Writes new tokens into their slots. k, v: [num_tokens, kv_heads, head_dim] BF16, FP16 or F32
// (vLLM's key/value layout); slot_mapping: I32 or I64 [num_tokens], slot = page * page_size +
// offset, a negative slot skips the token (padding, as vLLM), a slot >= num_pages * page_size or a
// slot written twice in one call is an error. An uncalibrated global (0) is first set from the
// tokens this call writes (K and V separately; stays 0 while their finite amax is 0, none
// written included). Host memory only.
Status paged_kv_append(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                       const PagedKvCache& cache);

// The cached tokens of every sequence, decoded: k_out, v_out F32 or F64
// [batch, max_len, kv_heads, head_dim] with max_len >= every seq_len; position j < seq_lens[b]
// reads page block_tables[b, j / page_size], offset j % page_size; positions beyond are 0. The
// values are the FP32 codec values (paged_kv_decode_*). For tests and the GPU tests' references.
Status paged_kv_dequantize(const PagedKvCache& cache, const TensorView& block_tables,
                           const TensorView& seq_lens, const TensorView& k_out,
                           const TensorView& v_out);

// The golden paged attention in float64 on the decoded cache.
//   q: [b, s_q, h, d] (every sequence has s_q query tokens: decode, speculative decode), or
//      [total_q, h, d] with cu_seqlens_q I32 [b + 1] (varlen prefill/extend; FlashAttention's
//      cu_seqlens, FlashInfer's qo_indptr). BF16/FP16/F32/F64. cu_seqlens_q undefined for rank 4.
//   block_tables: I32 [b, max_pages]; entries past a sequence's last page are not read (any
//      value); pages may be shared between sequences (prefix caching).
//   seq_lens: I32 [b], the cached tokens of each sequence including its queries' own.
//   o: like q (BF16/FP16/F32/F64). lse: [b, h, s_q] for rank-4 q, [h, total_q] for varlen, F32
//      or F64, natural log, optional. A row without visible keys: O = 0, LSE = +inf.
// GQA: query head i reads kv head i / (h / kv_heads). Host memory only; multithreaded.
Status golden_paged_attention(const TensorView& q, const TensorView& cu_seqlens_q,
                              const PagedKvCache& cache, const TensorView& block_tables,
                              const TensorView& seq_lens, const PagedAttentionOptions& opt,
                              const TensorView& o, const TensorView& lse);

// Split-KV partials: split s covers keys [s * split_size, (s + 1) * split_size) of every sequence
// (num_splits = o_partial.shape[0], num_splits * split_size >= every seq_len). Row r is query
// token r in q's order (rank-4 q: r = bi * s_q + i). o_partial: F32/F64
// [num_splits, total_q, h, d], the output normalized over the split's visible keys;
// lse_partial: F32/F64 [num_splits, total_q, h], the split's LSE (natural log). A split without
// visible keys: O = 0, LSE = -inf, so merges stay NaN-free.
Status golden_paged_attention_partials(const TensorView& q, const TensorView& cu_seqlens_q,
                                       const PagedKvCache& cache, const TensorView& block_tables,
                                       const TensorView& seq_lens, const PagedAttentionOptions& opt,
                                       int64_t split_size, const TensorView& o_partial,
                                       const TensorView& lse_partial);

// The exact LSE-weighted combine, in float64: m = max_s lse_s; w_s = exp(lse_s - m);
// O = sum_s w_s O_s / sum_s w_s; LSE = m + ln(sum_s w_s). All partials -inf: O = 0, LSE = +inf
// (the user-facing empty row). A NaN LSE makes the row NaN. o_partial/lse_partial as above (any
// float dtype); o: [total_q, h, d] BF16/FP16/F32/F64; lse: [h, total_q] F32/F64, optional.
Status combine_attention_partials(const TensorView& o_partial, const TensorView& lse_partial,
                                  const TensorView& o, const TensorView& lse);

}  // namespace fp4attn
