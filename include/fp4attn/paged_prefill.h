// Paged prefill / extend (issue 9) on the host: the operand layout that the GPU path
// (paged_prefill_cuda.h) writes into its workspace, the host reference of its gather/repack (the
// same bytes as the GPU kernel), and the golden paged prefill: the CPU golden forward on those
// operands. docs/kernels/decode.md, "Paged prefill", is the prose version.
//
// The GPU path gathers each sequence's cached K/V pages into contiguous kernel operands of the
// forward engine (operands.h), quantizes Q with the engine's operand quantizer and runs the engine
// once per run of consecutive sequences of equal (query, cached) lengths. The repack is exact
// except for one rounding of NVFP4 products (below); FP8 caches are copied byte for byte.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/attention.h"
#include "fp4attn/paged_kv.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

// The varlen operand layout of one batch: sequence i has n_q = cu_q[i + 1] - cu_q[i] queries and
// L = seq_len[i] cached keys (its queries' own included), and owns, at byte offsets of the
// workspace (each region 256-byte aligned, sequences packed without gaps inside a region):
//   q_data  E4M3 [h, n_q, d]              at q_data  + cu_q[i] * h * d
//   q_scale F32  [h, tiles(n_q)]          at q_scale + 4 * cu_q_tiles[i] * h
//   k_data  E4M3 [kv_heads, L, d]         at k_data  + cu_k[i] * kv_heads * d
//   k_scale F32  [kv_heads, tiles(L)]     at k_scale + 4 * cu_k_tiles[i] * kv_heads
//   v_data  E4M3 [kv_heads, d, pitch(L)]  at v_data  + cu_v[i] * kv_heads * d
//   v_scale F32  [kv_heads, d]            at v_scale + 4 * i * kv_heads * d
// tiles(n) = ceil(n / 128) (operand_scale_tiles), pitch(L) = L rounded up to 16
// (operand_v_pitch); cu_k is cu_seqlens_k (prefix sums of seq_lens). A run of consecutive
// sequences with the same n_q and L is one dense [n, ...] operand set of the engine.
struct PagedPrefillLayout {
  int64_t b = 0, h = 0, kv_heads = 0, head_dim = 0;
  std::vector<int64_t> cu_q, cu_q_tiles, cu_k, cu_k_tiles, cu_v;  // b + 1 entries each
  int64_t q_data = 0, q_scale = 0, k_data = 0, k_scale = 0, v_data = 0, v_scale = 0;
  int64_t bytes = 0;  // workspace size
  int64_t n_q(int64_t i) const { return cu_q[i + 1] - cu_q[i]; }
  int64_t len(int64_t i) const { return cu_k[i + 1] - cu_k[i]; }
};

// The layout from host copies of cu_seqlens_q (I32 [b + 1]: from 0, non-decreasing) and
// seq_lens (I32 [b], >= 0). Checks those values (messages name the argument).
Status paged_prefill_layout(const TensorView& cu_seqlens_q, const TensorView& seq_lens, int64_t h,
                            int64_t kv_heads, int64_t head_dim, PagedPrefillLayout* layout);

// The engine operands of sequences [first, first + n) (equal n_q and L) inside a workspace with
// that layout: q_data [n, h, n_q, d], k_data [n, kv_heads, L, d], ... (operands.h).
ForwardOperands paged_prefill_operands(const PagedPrefillLayout& layout, void* workspace,
                                       int64_t first, int64_t n);

// The NVFP4 fold's divisor: e2m1 (<= 6) * scale (<= 448) / 8 <= 336 < 448, exact in E4M3's range.
constexpr float kPagedPrefillFoldDivisor = 8.f;

// The NVFP4 fold of one cached element (the repack_to_operand_cuda rule): the E4M3 operand code
// E4M3_RNE(e2m1 * scale / 8) (both products exact in FP32), 0x7F for a NaN scale (0x7F/0xFF),
// whose operand factor is 8 / s_enc. The dequantized value e2m1 * scale / s_enc and the operand's
// value * factor differ by that one E4M3 rounding (relative <= 2^-4, none when e2m1 * scale / 8
// has at most 4 significant bits and is a normal E4M3 value).
uint8_t paged_prefill_fold_nvfp4(uint8_t code, uint8_t scale);

// The recipes a paged prefill's Q may use (its operand is E4M3 either way; the engine's P and V
// path are the same for both): kFp8 (default: per-128-token FP32 scales, the more accurate) and
// kNvfp4 (Four-Over-Six NVFP4 folded like K, s_enc per (sequence, head)).
bool paged_prefill_q_recipe_supported(Recipe r);

}  // namespace fp4attn
