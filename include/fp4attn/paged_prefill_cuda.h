// GPU paged prefill / extend over the paged KV cache (issue 9): many query tokens per sequence,
// causal (bottom-right), varlen, on the NVFP4 or FP8 cache of paged_kv.h. Work is queued on
// `stream`; nothing synchronizes. docs/kernels/decode.md, "Paged prefill", has the design.
//
// It runs in three steps, all on the stream:
//  1. a gather/repack kernel reads each sequence's cached K/V through its block table and writes
//     the forward engine's contiguous operands (paged_prefill.h's layout, in a workspace):
//     NVFP4 codes folded to E4M3 (e2m1 * scale / 8, factor 8 / s_enc; the repack_to_operand_cuda
//     rule, for V too), FP8 bytes copied (factor = the decode scale);
//  2. quantize_operand_cuda quantizes Q (opt q_recipe: fp8 by default, or nvfp4);
//  3. attention_forward_operands_cuda (the Hopper engine, sm_90a) runs once per run of
//     consecutive sequences with equal (query, cached) lengths: one launch for a uniform batch.
// The engine's numerics apply: P = E4M3(exp2(z - m + 8)), V in E4M3 (numerics.md §4), not the
// decode kernel's BF16 P (decode.md 7.4); golden_paged_prefill (paged_prefill.h) is the CPU model
// of exactly this computation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp4attn/paged_kv.h"
#include "fp4attn/paged_prefill.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct PagedPrefillCudaOptions {
  // Host copies (I32, host memory, the shapes of the device tensors) of block_tables, seq_lens and
  // cu_seqlens_q: REQUIRED. The engine is launched per run of equal lengths with shapes (and TMA
  // descriptors) built on the host, and the workspace layout is a prefix sum of the lengths, so
  // the host must know them; the golden's value checks (validate_paged_indices) run on them
  // before any launch. The kernels take every length and offset from these copies; of the device
  // tensors only block_tables is read (a page id there outside [0, num_pages) gives NaN codes,
  // never a read), seq_lens and cu_seqlens_q are checked for shape only.
  TensorView block_tables_host, seq_lens_host, cu_seqlens_q_host;
  // Q's operand recipe: kFp8 (per-128-token FP32 scales) or kNvfp4 (Four-Over-Six NVFP4, folded).
  // Both give E4M3 operands of the same cost; fp8 is the more accurate (paged_prefill.h).
  Recipe q_recipe = Recipe::kFp8;
  // Device scratch for the operands, optional: at least paged_prefill_workspace_bytes() bytes,
  // 256-byte aligned. Without it the call allocates (cudaMallocAsync) and frees (cudaFreeAsync)
  // on the stream. After the call the workspace holds the operands (paged_prefill_operands views
  // them), valid until it is reused.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The workspace paged_prefill_cuda needs (PagedPrefillLayout::bytes), from the host copies of
// cu_seqlens_q [b + 1] and seq_lens [b]. About (total_q * h + 2 * sum(seq_lens) * kv_heads) *
// head_dim bytes: the operands are one byte per value.
Status paged_prefill_workspace_bytes(const TensorView& cu_seqlens_q_host,
                                     const TensorView& seq_lens_host, int64_t h, int64_t kv_heads,
                                     int64_t head_dim, size_t* bytes);

// Paged prefill on the GPU:
//   q: BF16 or FP16 [total_q, h, d] (device; 16-byte aligned, token and head strides multiples of
//     8 elements, last dim contiguous) with cu_seqlens_q I32 [b + 1] (device); the queries of a
//     sequence are its last n_q tokens (seq_lens counts them: append first, then attend).
//   cache: NVFP4 or FP8 (paged_kv.h), device memory, head_dim 64 or 128; NVFP4 data views with
//     address and page/token/head strides multiples of 8 bytes, FP8 data views of 16; scale views
//     any strides; globals finite and > 0, or 0 (uncalibrated, paged_kv.h), read on the device.
//   block_tables I32 [b, max_pages], seq_lens I32 [b]: device memory (host copies: copt).
//   opt: softmax_scale (0: 1/sqrt(d)) and causal (bottom-right: query i of n_q sees key j iff
//     j <= i + L - n_q), as golden_paged_attention.
//   o: BF16/FP16 [total_q, h, d] (token and head strides even, 4-byte aligned); lse F32
//     [h, total_q] (natural log) or undefined. A row without visible keys: O = 0, LSE = +inf.
// GPU: sm_90a (the engine). Bad shapes, dtypes, alignment, host index values or device: a Status
// naming the argument, nothing launched.
Status paged_prefill_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                          const PagedKvCache& cache, const TensorView& block_tables,
                          const TensorView& seq_lens, const PagedAttentionOptions& opt,
                          const TensorView& o, const TensorView& lse,
                          const PagedPrefillCudaOptions& copt, cudaStream_t stream);

// Step 1 alone (the tests compare its bytes with paged_prefill_repack_host; the benchmark times
// it): writes the K/V regions of `workspace` (device, layout.bytes bytes, 256-byte aligned) for
// the layout. block_tables on the device, block_tables_host its host copy (page ids checked).
Status paged_prefill_repack_cuda(const PagedKvCache& cache, const TensorView& block_tables,
                                 const TensorView& block_tables_host,
                                 const PagedPrefillLayout& layout, void* workspace,
                                 cudaStream_t stream);

}  // namespace fp4attn
