#include "validate/validate_paged.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

Status invalid(const std::ostringstream& s) { return Status::Invalid(s.str()); }

Status check_tensor(const TensorView& t, const char* name, int rank, const char* dims,
                    std::initializer_list<DType> allowed) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(t, name, rank, dims));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, allowed));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  return check_not_null(t, name);
}

Status check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> want,
                   const char* why) {
  int i = 0;
  bool same = true;
  for (int64_t w : want) same = same && t.shape[i++] == w;
  if (same) return Status::Ok();
  std::ostringstream s;
  s << name << ": expected shape (";
  i = 0;
  for (int64_t w : want) s << (i++ ? ", " : "") << w;
  s << ") " << why << ", got " << t.shape_str();
  return invalid(s);
}

Status check_global(const TensorView& t, const char* name) {
  FP4ATTN_RETURN_IF_ERROR(check_tensor(t, name, 1, "(1)", {DType::kF32}));
  if (t.shape[0] != 1) {
    return Status::Invalid(std::string(name) + ": expected shape (1), got " + t.shape_str());
  }
  if (t.data == nullptr) return Status::Invalid(std::string(name) + ": data pointer is null");
  return Status::Ok();
}

int64_t at1(const TensorView& t, int64_t i) { return t.as<const int32_t>()[i * t.stride[0]]; }

}  // namespace

Status validate_paged_kv_cache(const PagedKvCache& cache, std::initializer_list<int> allowed_d,
                               bool writable, PagedKvShape* shape) {
  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  if (!fp4 && cache.format != KvCacheFormat::kFp8) {
    return Status::Invalid("cache.format: unknown KV cache format");
  }
  const char* dims = fp4 ? "(num_pages, page_size, kv_heads, head_dim / 2)"
                         : "(num_pages, page_size, kv_heads, head_dim)";
  // Packed E2M1 pairs are bytes; FP8 codes may come typed as E4M3.
  auto check_data = [&](const TensorView& t, const char* name) {
    return fp4 ? check_tensor(t, name, 4, dims, {DType::kU8})
               : check_tensor(t, name, 4, dims, {DType::kU8, DType::kE4M3});
  };
  FP4ATTN_RETURN_IF_ERROR(check_data(cache.k_data, "k_cache"));
  const TensorView& kd = cache.k_data;
  FP4ATTN_RETURN_IF_ERROR(check_data(cache.v_data, "v_cache"));
  FP4ATTN_RETURN_IF_ERROR(check_shape(cache.v_data, "v_cache",
                                      {kd.shape[0], kd.shape[1], kd.shape[2], kd.shape[3]},
                                      "like k_cache"));
  const int64_t d = fp4 ? 2 * kd.shape[3] : kd.shape[3];
  std::ostringstream s;
  if (fp4) {
    if (d % kNvfp4Block != 0) {
      s << "k_cache: head_dim " << d << " (2 * last dimension " << kd.shape[3]
        << ") is not a multiple of the NVFP4 block of 16";
      return invalid(s);
    }
    const char* sdims = "(num_pages, page_size, kv_heads, head_dim / 16)";
    for (const auto& [t, name] :
         {std::pair{&cache.k_scales, "k_scales"}, std::pair{&cache.v_scales, "v_scales"}}) {
      FP4ATTN_RETURN_IF_ERROR(check_tensor(*t, name, 4, sdims, {DType::kU8, DType::kE4M3}));
      FP4ATTN_RETURN_IF_ERROR(check_shape(
          *t, name, {kd.shape[0], kd.shape[1], kd.shape[2], d / kNvfp4Block}, "for k_cache"));
    }
  } else if (cache.k_scales.defined() || cache.v_scales.defined()) {
    return Status::Invalid(
        "k_scales/v_scales: the fp8 cache has per-tensor scales only (k_global, v_global); pass "
        "undefined views");
  }
  FP4ATTN_RETURN_IF_ERROR(check_global(cache.k_global, "k_global"));
  FP4ATTN_RETURN_IF_ERROR(check_global(cache.v_global, "v_global"));

  const int64_t num_pages = kd.shape[0], page_size = kd.shape[1], kv_heads = kd.shape[2];
  if (page_size < 1) {
    s << "k_cache: page_size (dimension 1) must be >= 1, got " << page_size;
    return invalid(s);
  }
  if (kv_heads < 1) {
    s << "k_cache: kv_heads (dimension 2) must be >= 1, got " << kv_heads;
    return invalid(s);
  }
  FP4ATTN_RETURN_IF_ERROR(check_head_dim(d, allowed_d, "k_cache"));
  if (num_pages * page_size > std::numeric_limits<int32_t>::max()) {
    s << "k_cache: num_pages * page_size = " << num_pages * page_size
      << " slots do not fit the int32 slot mapping";
    return invalid(s);
  }
  if (writable) {
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(cache.k_data, "k_cache"));
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(cache.v_data, "v_cache"));
    if (fp4) {
      FP4ATTN_RETURN_IF_ERROR(check_output_strides(cache.k_scales, "k_scales"));
      FP4ATTN_RETURN_IF_ERROR(check_output_strides(cache.v_scales, "v_scales"));
    }
  }
  *shape = PagedKvShape{num_pages, page_size, kv_heads, d};
  return Status::Ok();
}

Status validate_paged_append(const TensorView& k, const TensorView& v,
                             const TensorView& slot_mapping, const PagedKvShape& kv,
                             int64_t* num_tokens) {
  const char* dims = "(num_tokens, kv_heads, head_dim)";
  FP4ATTN_RETURN_IF_ERROR(check_tensor(k, "k", 3, dims, {DType::kBF16, DType::kF16, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_tensor(v, "v", 3, dims, {DType::kBF16, DType::kF16, DType::kF32}));
  const int64_t n = k.shape[0];
  FP4ATTN_RETURN_IF_ERROR(check_shape(k, "k", {n, kv.kv_heads, kv.head_dim}, "for the cache"));
  FP4ATTN_RETURN_IF_ERROR(check_shape(v, "v", {n, kv.kv_heads, kv.head_dim}, "like k"));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(slot_mapping, "slot_mapping", 1, "(num_tokens)", {DType::kI32, DType::kI64}));
  FP4ATTN_RETURN_IF_ERROR(check_shape(slot_mapping, "slot_mapping", {n}, "(one slot per token)"));
  *num_tokens = n;
  return Status::Ok();
}

int64_t slot_at(const TensorView& slot_mapping, int64_t i) {
  const int64_t at = i * slot_mapping.stride[0];
  return slot_mapping.dtype == DType::kI64 ? slot_mapping.as<const int64_t>()[at]
                                           : slot_mapping.as<const int32_t>()[at];
}

Status validate_slot_values(const TensorView& slot_mapping, const PagedKvShape& kv) {
  const int64_t n = slot_mapping.shape[0], slots = kv.num_pages * kv.page_size;
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, token): sorted to find repeats
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = slot_at(slot_mapping, i);
    if (slot < 0) continue;
    if (slot >= slots) {
      std::ostringstream s;
      s << "slot_mapping[" << i << "]: slot " << slot << " is out of range [0, " << slots
        << ") (num_pages " << kv.num_pages << " * page_size " << kv.page_size << ")";
      return invalid(s);
    }
    used.emplace_back(slot, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t j = 1; j < used.size(); ++j) {
    if (used[j].first == used[j - 1].first) {
      std::ostringstream s;
      s << "slot_mapping[" << used[j].second << "]: slot " << used[j].first
        << " is also written by token " << used[j - 1].second
        << " of the same append (the result would depend on the order of writes)";
      return invalid(s);
    }
  }
  return Status::Ok();
}

Status validate_global_scale(float value, const char* name) {
  if (value == 0.f || (std::isfinite(value) && value > 0.f)) return Status::Ok();
  std::ostringstream s;
  s << name << ": expected a finite scale > 0 (or 0: uncalibrated), got " << value;
  return invalid(s);
}

Status validate_paged_attention(const TensorView& q, const TensorView& cu_seqlens_q,
                                const TensorView& block_tables, const TensorView& seq_lens,
                                const TensorView& o, const TensorView& lse, const PagedKvShape& kv,
                                PagedQueryShape* shape) {
  std::initializer_list<DType> floats = {DType::kF64, DType::kF32, DType::kBF16, DType::kF16};
  const bool varlen = q.rank == 3;
  if (q.rank != 3 && q.rank != 4) {
    std::ostringstream s;
    s << "q: expected rank 4 (batch, seqlen_q, heads, head_dim) or rank 3 (total_q, heads, "
         "head_dim) with cu_seqlens_q, got rank "
      << q.rank;
    return invalid(s);
  }
  FP4ATTN_RETURN_IF_ERROR(check_tensor(
      q, "q", q.rank, varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)",
      floats));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(block_tables, "block_tables", 2, "(batch, max_pages)", {DType::kI32}));
  const int64_t b = block_tables.shape[0];
  FP4ATTN_RETURN_IF_ERROR(check_tensor(seq_lens, "seq_lens", 1, "(batch)", {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_shape(seq_lens, "seq_lens", {b}, "(one per block_tables row)"));
  const int64_t h = q.shape[q.rank - 2], d = q.shape[q.rank - 1];
  int64_t total_q = 0, s_q = -1;
  if (varlen) {
    if (!cu_seqlens_q.defined()) {
      return Status::Invalid("cu_seqlens_q: required with a rank-3 (varlen) q");
    }
    FP4ATTN_RETURN_IF_ERROR(
        check_tensor(cu_seqlens_q, "cu_seqlens_q", 1, "(batch + 1)", {DType::kI32}));
    FP4ATTN_RETURN_IF_ERROR(check_shape(cu_seqlens_q, "cu_seqlens_q", {b + 1}, "(batch + 1)"));
    total_q = q.shape[0];
  } else {
    if (cu_seqlens_q.defined()) {
      return Status::Invalid(
          "cu_seqlens_q: only for a rank-3 (varlen) q; a rank-4 q has s_q tokens per sequence");
    }
    FP4ATTN_RETURN_IF_ERROR(check_shape(q, "q", {b, q.shape[1], h, d}, "(batch of block_tables)"));
    s_q = q.shape[1];
    total_q = b * s_q;
  }
  std::ostringstream s;
  if (d != kv.head_dim) {
    s << "q: head_dim " << d << " differs from the cache's " << kv.head_dim;
    return invalid(s);
  }
  if (h % kv.kv_heads != 0) {
    s << "q/k_cache: number of heads " << h << " is not a multiple of kv heads " << kv.kv_heads;
    return invalid(s);
  }
  if (!o.defined()) {  // split-KV partials write no o
    *shape = PagedQueryShape{b, total_q, h, d, block_tables.shape[1], s_q, varlen};
    return Status::Ok();
  }
  FP4ATTN_RETURN_IF_ERROR(check_tensor(
      o, "o", q.rank, varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)",
      floats));
  for (int i = 0; i < q.rank; ++i) {
    if (o.shape[i] != q.shape[i]) {
      s << "o: expected shape " << q.shape_str() << " like q, got " << o.shape_str();
      return invalid(s);
    }
  }
  FP4ATTN_RETURN_IF_ERROR(check_output_strides(o, "o"));
  if (lse.defined()) {
    if (varlen) {
      FP4ATTN_RETURN_IF_ERROR(
          check_tensor(lse, "lse", 2, "(heads, total_q)", {DType::kF32, DType::kF64}));
      FP4ATTN_RETURN_IF_ERROR(check_shape(lse, "lse", {h, total_q}, "(heads, total_q)"));
    } else {
      FP4ATTN_RETURN_IF_ERROR(
          check_tensor(lse, "lse", 3, "(batch, heads, seqlen_q)", {DType::kF32, DType::kF64}));
      FP4ATTN_RETURN_IF_ERROR(check_shape(lse, "lse", {b, h, s_q}, "(batch, heads, seqlen_q)"));
    }
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(lse, "lse"));
  }
  *shape = PagedQueryShape{b, total_q, h, d, block_tables.shape[1], s_q, varlen};
  return Status::Ok();
}

Status validate_paged_indices(const TensorView& cu_seqlens_q, const TensorView& block_tables,
                              const TensorView& seq_lens, const PagedKvShape& kv,
                              const PagedQueryShape& qs) {
  const int32_t* bt = block_tables.as<const int32_t>();
  for (int64_t bi = 0; bi < qs.b; ++bi) {
    const int64_t len = at1(seq_lens, bi);
    std::ostringstream s;
    if (len < 0 || len > qs.max_pages * kv.page_size) {
      s << "seq_lens[" << bi << "]: " << len << " is out of range [0, "
        << qs.max_pages * kv.page_size << "] (block_tables has " << qs.max_pages << " pages of "
        << kv.page_size << " tokens)";
      return invalid(s);
    }
    const int64_t pages = (len + kv.page_size - 1) / kv.page_size;
    for (int64_t p = 0; p < pages; ++p) {
      const int64_t id = bt[bi * block_tables.stride[0] + p * block_tables.stride[1]];
      if (id < 0 || id >= kv.num_pages) {
        s << "block_tables[" << bi << ", " << p << "]: page id " << id << " is out of range [0, "
          << kv.num_pages << ")";
        return invalid(s);
      }
    }
  }
  if (!qs.varlen) return Status::Ok();
  if (at1(cu_seqlens_q, 0) != 0) {
    return Status::Invalid("cu_seqlens_q[0]: expected 0, got " +
                           std::to_string(at1(cu_seqlens_q, 0)));
  }
  for (int64_t bi = 0; bi < qs.b; ++bi) {
    if (at1(cu_seqlens_q, bi + 1) < at1(cu_seqlens_q, bi)) {
      std::ostringstream s;
      s << "cu_seqlens_q[" << bi + 1 << "]: " << at1(cu_seqlens_q, bi + 1)
        << " is below cu_seqlens_q[" << bi << "] = " << at1(cu_seqlens_q, bi);
      return invalid(s);
    }
  }
  if (at1(cu_seqlens_q, qs.b) != qs.total_q) {
    std::ostringstream s;
    s << "cu_seqlens_q[" << qs.b << "]: expected total_q = " << qs.total_q
      << " (q's dimension 0), got " << at1(cu_seqlens_q, qs.b);
    return invalid(s);
  }
  return Status::Ok();
}

Status validate_partials(const TensorView& o_partial, const TensorView& lse_partial,
                         std::initializer_list<DType> allowed, bool writable) {
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(o_partial, "o_partial", 4, "(num_splits, total_q, heads, head_dim)", allowed));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(lse_partial, "lse_partial", 3, "(num_splits, total_q, heads)", allowed));
  const TensorView& op = o_partial;
  FP4ATTN_RETURN_IF_ERROR(check_shape(lse_partial, "lse_partial",
                                      {op.shape[0], op.shape[1], op.shape[2]}, "for o_partial"));
  if (writable) {
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(o_partial, "o_partial"));
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(lse_partial, "lse_partial"));
  }
  return Status::Ok();
}

}  // namespace fp4attn
