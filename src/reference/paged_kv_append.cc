// Host reference of the paged KV cache's writes and reads: append through a slot mapping (with
// calibration of an unset global scale) and the decoded view of the cached sequences. Plain loops:
// this defines the bytes the GPU append must write.
#include <algorithm>
#include <vector>

#include "fp4attn/golden/paged_kv.h"
#include "reference/paged_kv_internal.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

using paged_internal::read_global;
using paged_internal::token_offset;

// Token i, kv head hk of k or v as FP32 (BF16/FP16/F32 inputs are exact in FP32).
void load_row(const TensorView& t, int64_t i, int64_t hk, float* out) {
  const int64_t base = i * t.stride[0] + hk * t.stride[1];
  for (int64_t c = 0; c < t.shape[2]; ++c) out[c] = static_cast<float>(load_as_double(t, base + c));
}

// Max |x| over the finite values of every written token (slot >= 0) of t: the calibration amax.
float written_amax(const TensorView& t, const TensorView& slots) {
  std::vector<float> row(t.shape[2]);
  float amax = 0.f;
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    if (slot_at(slots, i) < 0) continue;
    for (int64_t hk = 0; hk < t.shape[1]; ++hk) {
      load_row(t, i, hk, row.data());
      amax = std::max(amax, finite_amax(row.data(), t.shape[2]));
    }
  }
  return amax;
}

// The global this append stores: the stored one, or (0 = uncalibrated) calibrated from this
// append's written tokens, which stays 0 when their finite amax is 0 (paged_kv_calibrate_*).
// Nothing is written here, so that a later error leaves the cache untouched.
Status resolve_global(const PagedKvCache& c, const TensorView& x, const TensorView& slots,
                      const TensorView& global, const char* name, float* out) {
  const float g = read_global(global);
  if (g != 0.f) {
    FP4ATTN_RETURN_IF_ERROR(validate_global_scale(g, name));
    *out = g;
    return Status::Ok();
  }
  const float amax = written_amax(x, slots);
  *out = c.format == KvCacheFormat::kNvfp4 ? paged_kv_calibrate_nvfp4(amax, c.rule)
                                           : paged_kv_calibrate_fp8(amax);
  return Status::Ok();
}

void write_side(const PagedKvCache& c, bool is_v, const TensorView& x, const TensorView& slots,
                int64_t page_size, float stored_global) {
  const float global = paged_kv_encode_global(stored_global);
  const TensorView& data = is_v ? c.v_data : c.k_data;
  const TensorView& scales = is_v ? c.v_scales : c.k_scales;
  const int64_t d = x.shape[2];
  const float inv = c.format == KvCacheFormat::kFp8 ? paged_kv_fp8_inverse(global) : 0.f;
  std::vector<float> row(d);
  for (int64_t i = 0; i < x.shape[0]; ++i) {
    const int64_t slot = slot_at(slots, i);
    if (slot < 0) continue;
    const int64_t page = slot / page_size, offset = slot % page_size;
    for (int64_t hk = 0; hk < x.shape[1]; ++hk) {
      load_row(x, i, hk, row.data());
      uint8_t* dst = data.as<uint8_t>() + token_offset(data, page, offset, hk);
      if (c.format == KvCacheFormat::kFp8) {
        for (int64_t e = 0; e < d; ++e) dst[e] = paged_kv_encode_fp8(row[e], inv);
      } else {
        uint8_t* sdst = scales.as<uint8_t>() + token_offset(scales, page, offset, hk);
        paged_kv_encode_nvfp4(row.data(), static_cast<int>(d), global, c.rule, dst, sdst);
      }
    }
  }
}

}  // namespace

Status paged_kv_append(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                       const PagedKvCache& cache) {
  PagedKvShape kv;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {}, /*writable=*/true, &kv));
  int64_t n = 0;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_append(k, v, slot_mapping, kv, &n));
  FP4ATTN_RETURN_IF_ERROR(validate_slot_values(slot_mapping, kv));
  bool any_written = false;
  for (int64_t i = 0; i < n && !any_written; ++i) {
    any_written = slot_at(slot_mapping, i) >= 0;
  }
  float gk = 0, gv = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_global(cache, k, slot_mapping, cache.k_global, "k_global", &gk));
  FP4ATTN_RETURN_IF_ERROR(resolve_global(cache, v, slot_mapping, cache.v_global, "v_global", &gv));
  if (!any_written) return Status::Ok();
  *cache.k_global.as<float>() = gk;
  *cache.v_global.as<float>() = gv;
  write_side(cache, false, k, slot_mapping, kv.page_size, gk);
  write_side(cache, true, v, slot_mapping, kv.page_size, gv);
  return Status::Ok();
}

Status paged_kv_dequantize(const PagedKvCache& cache, const TensorView& block_tables,
                           const TensorView& seq_lens, const TensorView& k_out,
                           const TensorView& v_out) {
  PagedKvShape kv;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {}, /*writable=*/false, &kv));
  FP4ATTN_RETURN_IF_ERROR(check_rank(block_tables, "block_tables", 2, "(batch, max_pages)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(block_tables, "block_tables", {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(block_tables, "block_tables"));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(block_tables, "block_tables"));
  const int64_t b = block_tables.shape[0];
  FP4ATTN_RETURN_IF_ERROR(check_rank(seq_lens, "seq_lens", 1, "(batch)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(seq_lens, "seq_lens", {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(seq_lens, "seq_lens"));
  if (seq_lens.shape[0] != b) {
    return Status::Invalid("seq_lens: expected shape (" + std::to_string(b) +
                           ") (one per block_tables row), got " + seq_lens.shape_str());
  }
  const PagedQueryShape qs{b, 0, 0, kv.head_dim, block_tables.shape[1], 0, false};
  FP4ATTN_RETURN_IF_ERROR(validate_paged_indices(TensorView{}, block_tables, seq_lens, kv, qs));
  int64_t max_len = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    max_len = std::max<int64_t>(max_len, seq_lens.as<const int32_t>()[bi * seq_lens.stride[0]]);
  }
  for (const auto& [t, name] : {std::pair{&k_out, "k_out"}, std::pair{&v_out, "v_out"}}) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(*t, name, 4, "(batch, max_len, kv_heads, head_dim)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(*t, name, {DType::kF32, DType::kF64}));
    FP4ATTN_RETURN_IF_ERROR(check_strides(*t, name));
    FP4ATTN_RETURN_IF_ERROR(check_not_null(*t, name));
    if (t->shape[0] != b || t->shape[1] < max_len || t->shape[2] != kv.kv_heads ||
        t->shape[3] != kv.head_dim) {
      return Status::Invalid(std::string(name) + ": expected shape (" + std::to_string(b) +
                             ", >= " + std::to_string(max_len) + ", " +
                             std::to_string(kv.kv_heads) + ", " + std::to_string(kv.head_dim) +
                             "), got " + t->shape_str());
    }
  }
  const float gk = read_global(cache.k_global), gv = read_global(cache.v_global);
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(gk, "k_global"));
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(gv, "v_global"));

  std::vector<float> row(kv.head_dim);
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t len = seq_lens.as<const int32_t>()[bi * seq_lens.stride[0]];
    for (int64_t j = 0; j < k_out.shape[1]; ++j) {
      const int64_t page =
          j < len ? block_tables.as<const int32_t>()[bi * block_tables.stride[0] +
                                                     (j / kv.page_size) * block_tables.stride[1]]
                  : -1;
      for (int64_t hk = 0; hk < kv.kv_heads; ++hk) {
        for (int side = 0; side < 2; ++side) {
          const TensorView& out = side ? v_out : k_out;
          if (page >= 0) {
            paged_internal::decode_token(cache, side == 1, page, j % kv.page_size, hk, kv.head_dim,
                                         side ? gv : gk, row.data());
          } else {
            std::fill(row.begin(), row.end(), 0.f);
          }
          const int64_t base = bi * out.stride[0] + j * out.stride[1] + hk * out.stride[2];
          for (int64_t c = 0; c < kv.head_dim; ++c) store_from_double(out, base + c, row[c]);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace fp4attn
