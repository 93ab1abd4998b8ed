// The GPU backend of `fp4attn decode`: paged_attention_cuda on a host-built paged cache (built
// when CUDA is; a stub that reports why not otherwise).
#pragma once

#include <string>

#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::cli {

// Empty when the decode kernel can run here; otherwise the reason, for the user.
std::string decode_gpu_unavailable_reason();

// cache: host views (contiguous arrays); q [b, s_q, h, d] host F32 holding BF16-exact values;
// block_tables I32 [b, max_pages] and seq_lens I32 [b] on the host; o [b, s_q, h, d] host F64.
// Copies everything to the device, runs the kernel, copies O back. *ms: median time of one call
// (CUDA events, after warm-up).
Status run_decode_gpu(const PagedKvCache& cache, const TensorView& q,
                      const TensorView& block_tables, const TensorView& seq_lens,
                      const PagedAttentionOptions& opt, const TensorView& o, double* ms);

}  // namespace fp4attn::cli
