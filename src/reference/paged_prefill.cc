// The paged prefill's host reference (golden/paged_prefill.h): the gather/repack (written element
// by element, independent of the GPU kernel's bit tricks) and the golden paged prefill on those
// operands.
#include "fp4attn/golden/paged_prefill.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"
#include "reference/paged_kv_internal.h"
#include "validate/validate_paged.h"

namespace fp4attn {

Status paged_prefill_repack_host(const PagedKvCache& cache, const TensorView& block_tables,
                                 const PagedPrefillLayout& x, void* workspace) {
  PagedKvShape kv{};
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {}, /*writable=*/false, &kv));
  FP4ATTN_RETURN_IF_ERROR(check_rank(block_tables, "block_tables", 2, "(batch, max_pages)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(block_tables, "block_tables", {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(block_tables, "block_tables"));
  if (block_tables.shape[0] != x.b || kv.kv_heads != x.kv_heads || kv.head_dim != x.head_dim) {
    return Status::Invalid(
        "block_tables/k_cache: batch, kv heads or head_dim differ from the "
        "layout's");
  }
  const float k_global = paged_internal::read_global(cache.k_global);
  const float v_global = paged_internal::read_global(cache.v_global);
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(k_global, "k_global"));
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(v_global, "v_global"));
  const int64_t max_pages = block_tables.shape[1], d = x.head_dim, hk = x.kv_heads;
  const int32_t* bt = block_tables.as<const int32_t>();
  for (int64_t i = 0; i < x.b; ++i) {
    if (x.len(i) > max_pages * kv.page_size) {
      return Status::Invalid(
          "seq_lens[" + std::to_string(i) + "]: " + std::to_string(x.len(i)) +
          " exceeds max_pages * page_size = " + std::to_string(max_pages * kv.page_size));
    }
    for (int64_t p = 0; p < (x.len(i) + kv.page_size - 1) / kv.page_size; ++p) {
      const int64_t id = bt[i * block_tables.stride[0] + p * block_tables.stride[1]];
      if (id < 0 || id >= kv.num_pages) {
        return Status::Invalid("block_tables[" + std::to_string(i) + ", " + std::to_string(p) +
                               "]: page id " + std::to_string(id) + " is out of range [0, " +
                               std::to_string(kv.num_pages) + ")");
      }
    }
  }
  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  // Operand factors: 8 / s_enc (FP32 division) for NVFP4, the decode scale for FP8; 0 for an
  // uncalibrated global.
  const float k_factor = paged_kv_decode_factor(fp4, k_global, kPagedPrefillFoldDivisor);
  const float v_factor = paged_kv_decode_factor(fp4, v_global, kPagedPrefillFoldDivisor);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  // One cached element as an operand code.
  auto element = [&](bool is_v, int64_t page, int64_t off, int64_t head, int64_t c) -> uint8_t {
    const TensorView& data = is_v ? cache.v_data : cache.k_data;
    const uint8_t* p =
        data.as<const uint8_t>() + paged_internal::token_offset(data, page, off, head);
    if (!fp4) return p[c];
    const TensorView& sc = is_v ? cache.v_scales : cache.k_scales;
    const uint8_t* s = sc.as<const uint8_t>() + paged_internal::token_offset(sc, page, off, head);
    const uint8_t code = (c & 1) ? e2m1x2_second(p[c / 2]) : e2m1x2_first(p[c / 2]);
    return paged_prefill_fold_nvfp4(code, s[c / kNvfp4Block]);
  };
  for (int64_t i = 0; i < x.b; ++i) {
    const int64_t len = x.len(i), pitch = operand_v_pitch(len), tiles = operand_scale_tiles(len);
    if (len == 0) continue;  // no operand bytes; its v_scale is not written (as on the GPU)
    uint8_t* kd = ws + x.k_data + x.cu_k[i] * hk * d;
    float* ks = reinterpret_cast<float*>(ws + x.k_scale) + x.cu_k_tiles[i] * hk;
    uint8_t* vd = ws + x.v_data + x.cu_v[i] * hk * d;
    float* vs = reinterpret_cast<float*>(ws + x.v_scale) + i * hk * d;
    for (int64_t head = 0; head < hk; ++head) {
      for (int64_t t = 0; t < tiles; ++t) ks[head * tiles + t] = k_factor;
      for (int64_t c = 0; c < d; ++c) {
        vs[head * d + c] = v_factor;
        std::memset(vd + (head * d + c) * pitch, 0, static_cast<size_t>(pitch));
      }
      for (int64_t j = 0; j < len; ++j) {
        const int64_t page =
            bt[i * block_tables.stride[0] + (j / kv.page_size) * block_tables.stride[1]];
        const int64_t off = j % kv.page_size;
        for (int64_t c = 0; c < d; ++c) {
          kd[(head * len + j) * d + c] = element(false, page, off, head, c);
          vd[(head * d + c) * pitch + operand_v_position_of(j)] = element(true, page, off, head, c);
        }
      }
    }
  }
  return Status::Ok();
}

Status golden_paged_prefill(const TensorView& q, const TensorView& cu_seqlens_q,
                            const PagedKvCache& cache, const TensorView& block_tables,
                            const TensorView& seq_lens, const PagedAttentionOptions& opt,
                            Recipe q_recipe, const TensorView& o, const TensorView& lse) {
  PagedKvShape kv{};
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {64, 128}, /*writable=*/false, &kv));
  PagedQueryShape qs{};
  FP4ATTN_RETURN_IF_ERROR(
      validate_paged_attention(q, cu_seqlens_q, block_tables, seq_lens, o, lse, kv, &qs));
  if (!qs.varlen) {
    return Status::Unsupported(
        "q: paged prefill takes a varlen q [total_q, heads, head_dim] "
        "with cu_seqlens_q");
  }
  if (!paged_prefill_q_recipe_supported(q_recipe)) {
    return Status::Unsupported(std::string("q_recipe: '") + recipe_name(q_recipe) +
                               "' is not supported for paged prefill (fp8, nvfp4)");
  }
  FP4ATTN_RETURN_IF_ERROR(validate_paged_indices(cu_seqlens_q, block_tables, seq_lens, kv, qs));
  PagedPrefillLayout x;
  FP4ATTN_RETURN_IF_ERROR(
      paged_prefill_layout(cu_seqlens_q, seq_lens, qs.h, kv.kv_heads, kv.head_dim, &x));
  std::vector<uint8_t> ws(static_cast<size_t>(x.bytes), 0);
  FP4ATTN_RETURN_IF_ERROR(paged_prefill_repack_host(cache, block_tables, x, ws.data()));
  RecipeOptions ro;
  ro.recipe = q_recipe;
  ro.softmax_scale = opt.softmax_scale;
  ro.causal = opt.causal;
  const int64_t h = qs.h, d = qs.d;
  const int es_q = dtype_size(q.dtype), es_o = dtype_size(o.dtype);
  for (int64_t i = 0; i < x.b; ++i) {
    const int64_t nq = x.n_q(i), q0 = x.cu_q[i];
    if (nq == 0) continue;
    const ForwardOperands in = paged_prefill_operands(x, ws.data(), i, 1);
    const TensorView qi =
        make_strided_view(static_cast<uint8_t*>(q.data) + q0 * q.stride[0] * es_q, q.dtype,
                          {1, nq, h, d}, {nq * q.stride[0], q.stride[0], q.stride[1], 1});
    FP4ATTN_RETURN_IF_ERROR(quantize_operand_host(qi, q_recipe, OperandRole::kQ, OperandOptions{},
                                                  in.q_data, in.q_scale, TensorView{}));
    const TensorView oi =
        make_strided_view(static_cast<uint8_t*>(o.data) + q0 * o.stride[0] * es_o, o.dtype,
                          {1, nq, h, d}, {nq * o.stride[0], o.stride[0], o.stride[1], 1});
    TensorView li;
    if (lse.defined()) {
      li = make_strided_view(
          static_cast<uint8_t*>(lse.data) + q0 * lse.stride[1] * dtype_size(lse.dtype), lse.dtype,
          {1, h, nq}, {h * lse.stride[0], lse.stride[0], lse.stride[1]});
    }
    FP4ATTN_RETURN_IF_ERROR(golden_attention_forward_operands(in, ro, oi, li));
  }
  return Status::Ok();
}

}  // namespace fp4attn
