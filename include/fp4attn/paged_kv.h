// Paged KV cache in NVFP4 (FP8 as the comparison point) for decode and paged prefill (issue 9),
// and its host reference: the append through a slot mapping, the golden paged attention (decode,
// speculative decode, prefill/extend), split-KV partials and their combine.
// docs/kernels/decode.md is the prose version; the GPU append reproduces the bytes written here
// (it calls the FP4ATTN_HD helpers below), the GPU attention is checked against the golden one.
#pragma once

#include <cstdint>

#include "fp4attn/config.h"
#include "fp4attn/formats.h"
#include "fp4attn/quantize.h"
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
// A global of 0 means "not calibrated yet": the next append that writes a token sets it from that
// append's data (paged_kv_calibrate_*). Otherwise it must be finite and > 0.
struct PagedKvCache {
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  TensorView k_data, v_data;
  TensorView k_scales, v_scales;
  TensorView k_global, v_global;
  // NVFP4 block scale rule of the append. kNearest (default) is what Blackwell NVFP4 kernels and
  // their quantizers produce; every rule writes valid NVFP4 (kFourOverSix is vLLM's nvfp4_4over6).
  Nvfp4ScaleRule rule = Nvfp4ScaleRule::kNearest;
};

// vLLM's slot convention: token `offset` of page `page` is slot page * page_size + offset.
constexpr int64_t paged_kv_slot(int64_t page, int64_t page_size, int64_t offset) {
  return page * page_size + offset;
}

// ---- Codecs of one token (host and device) -----------------------------------------------------

// One token of one head: d values (d % 16 == 0) -> d / 2 packed bytes and d / 16 E4M3 scales,
// block by block with nvfp4_quantize_block, so the bytes equal nvfp4_quantize_rows +
// pack_e2m1_rows on the same row.
FP4ATTN_HD void paged_kv_encode_nvfp4(const float* x, int d, float s_enc, Nvfp4ScaleRule rule,
                                      uint8_t* packed, uint8_t* scales) {
  uint8_t codes[kNvfp4Block];
  for (int b = 0; b < d / kNvfp4Block; ++b) {
    scales[b] = nvfp4_quantize_block(x + b * kNvfp4Block, kNvfp4Block, s_enc, rule, codes);
    for (int j = 0; j < kNvfp4Block / 2; ++j) {
      packed[b * (kNvfp4Block / 2) + j] = pack_e2m1x2(codes[2 * j], codes[2 * j + 1]);
    }
  }
}

// Element c of a packed NVFP4 token: the codec's FP32 value, e2m1 * scale / s_enc.
FP4ATTN_HD float paged_kv_decode_nvfp4(const uint8_t* packed, const uint8_t* scales, int c,
                                       float s_enc) {
  const uint8_t byte = packed[c / 2];
  const uint8_t code = (c & 1) ? e2m1x2_second(byte) : e2m1x2_first(byte);
  return nvfp4_dequantize(code, scales[c / kNvfp4Block], s_enc);
}

// The FP8 multiplier of a decode scale: 1 / scale in FP32, FLT_MAX when that overflows (a tiny
// scale). One division per append, then one multiply per element.
FP4ATTN_HD float paged_kv_fp8_inverse(float scale) {
  const float inv = detail::div_rn(1.f, scale);
  return detail::is_finite(inv) ? inv : bits_float(detail::kFltMaxBits);
}

// E4M3_RNE(x * inv), satfinite; NaN and +-Inf give 0x7F/0xFF (NaN), per element.
FP4ATTN_HD uint8_t paged_kv_encode_fp8(float x, float inv) {
  return float_to_e4m3(detail::mul_rn(x, inv));
}

// e4m3 * scale, rounded to FP32.
FP4ATTN_HD float paged_kv_decode_fp8(uint8_t code, float scale) {
  return detail::mul_rn(e4m3_to_float(code), scale);
}

// Calibration from the first append. amax is the largest |x| over that append's *finite* values
// (so one NaN token cannot pin the layer's scale; its own blocks still carry the NaN).
//   NVFP4: nvfp4_tensor_scale(amax, rule) = 2688 / amax (2304 / amax for kRestricted), 1 if 0.
//   FP8:   amax / 448, 1 if amax is 0.
FP4ATTN_HD float paged_kv_calibrate_nvfp4(float amax_finite, Nvfp4ScaleRule rule) {
  return nvfp4_tensor_scale(amax_finite, rule);
}
FP4ATTN_HD float paged_kv_calibrate_fp8(float amax_finite) {
  if (!(amax_finite > 0.f)) return 1.f;
  const float s = detail::div_rn(amax_finite, kE4m3Max);
  return s > 0.f ? s : bits_float(1);  // amax below 448 * 2^-149 would round to 0
}

// Max |x| over the finite values of x[0..n) (NaN and Inf skipped); 0 if none.
FP4ATTN_HD float finite_amax(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = float_bits(x[i]) & detail::kAbsMask;
    if (detail::abs_bits_is_finite(a) && a > m) m = a;
  }
  return bits_float(m);
}

// ---- Host reference (src/reference/paged_kv_*.cc) ----------------------------------------------

// Writes new tokens into their slots. k, v: [num_tokens, kv_heads, head_dim] BF16, FP16 or F32
// (vLLM's key/value layout); slot_mapping: I32 [num_tokens], slot = page * page_size + offset, a
// negative slot skips the token (padding, as vLLM), a slot >= num_pages * page_size or a slot
// written twice in one call is an error. An uncalibrated global (0) is first set from the tokens
// this call writes (K and V separately; none written: stays 0). Host memory only.
Status paged_kv_append(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                       const PagedKvCache& cache);

// The cached tokens of every sequence, decoded: k_out, v_out F32 or F64
// [batch, max_len, kv_heads, head_dim] with max_len >= every seq_len; position j < seq_lens[b]
// reads page block_tables[b, j / page_size], offset j % page_size; positions beyond are 0. The
// values are the FP32 codec values (paged_kv_decode_*). For tests and the GPU tests' references.
Status paged_kv_dequantize(const PagedKvCache& cache, const TensorView& block_tables,
                           const TensorView& seq_lens, const TensorView& k_out,
                           const TensorView& v_out);

struct PagedAttentionOptions {
  double softmax_scale = 0;  // 0 means 1/sqrt(head_dim)
  // Bottom-right aligned: query i of a sequence with s_q queries and L cached tokens sees key j
  // iff j <= i + L - s_q (the queries are the last s_q tokens, their K/V appended first).
  bool causal = true;
};

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
