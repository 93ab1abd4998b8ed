// The paged prefill's host reference: the gather/repack into the layout of paged_prefill.h (the
// same bytes as the GPU kernel) and the golden paged prefill, the CPU golden forward on those
// operands.
#pragma once

#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/paged_prefill.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

// The host reference of the gather/repack: writes the k_data, k_scale, v_data and v_scale regions
// of `workspace` (host memory, layout.bytes bytes; the Q regions are not touched) from the cache
// (host memory) through block_tables (I32 [b, max_pages]); lengths come from the layout.
//   NVFP4: K and V codes folded by paged_prefill_fold_nvfp4, every K tile factor and V channel
//          factor 8 / s_enc (FP32 division).
//   FP8:   K and V bytes copied as they are, K tile factors and V channel factors = the cache's
//          decode scale.
// V keys permuted within 16-key groups (operand_v_position_of), padding keys (L..pitch(L)) 0.
// A sequence with L = 0 has no K/V bytes, and its v_scale is left as it was.
// Runs the golden's checks of the cache and the page ids first.
Status paged_prefill_repack_host(const PagedKvCache& cache, const TensorView& block_tables,
                                 const PagedPrefillLayout& layout, void* workspace);

// The golden paged prefill in the GPU path's numerics: the layout, this host repack, Q quantized
// by quantize_operand_host (q_recipe, per sequence), then golden_attention_forward_operands per
// sequence (recipe q_recipe: P = E4M3(exp2(z - m + 8)), the engine's rule). Arguments as
// golden_paged_attention with a varlen q: q [total_q, h, d] BF16/FP16 (FP32 if BF16-exact),
// cu_seqlens_q I32 [b + 1], o [total_q, h, d] any float dtype, lse [h, total_q] F32/F64 or
// undefined. Host memory; d 64 or 128.
Status golden_paged_prefill(const TensorView& q, const TensorView& cu_seqlens_q,
                            const PagedKvCache& cache, const TensorView& block_tables,
                            const TensorView& seq_lens, const PagedAttentionOptions& opt,
                            Recipe q_recipe, const TensorView& o, const TensorView& lse);

}  // namespace fp4attn
