// Host side of paged prefill (paged_prefill.h): the operand layout, the host reference of the
// gather/repack (written element by element, independent of the GPU kernel's bit tricks), and the
// golden paged prefill on those operands.
#include "fp4attn/paged_prefill.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "api/validate_paged.h"
#include "fp4attn/formats.h"
#include "fp4attn/golden.h"
#include "fp4attn/operands.h"
#include "reference/paged_kv_internal.h"

namespace fp4attn {
namespace {

constexpr int64_t kRegionAlign = 256;
constexpr float kFoldDivisor = 8.f;  // e2m1 (<= 6) * scale (<= 448) / 8 <= 336 < 448

int64_t align_up(int64_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

int64_t at(const TensorView& t, int64_t i) { return t.as<const int32_t>()[i * t.stride[0]]; }

Status check_index_tensor(const TensorView& t, const char* name, const char* dims) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(t, name, 1, dims));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  return check_not_null(t, name);
}

}  // namespace

Status paged_prefill_layout(const TensorView& cu_seqlens_q, const TensorView& seq_lens, int64_t h,
                            int64_t kv_heads, int64_t head_dim, PagedPrefillLayout* layout) {
  FP4ATTN_RETURN_IF_ERROR(check_index_tensor(seq_lens, "seq_lens", "(batch)"));
  FP4ATTN_RETURN_IF_ERROR(check_index_tensor(cu_seqlens_q, "cu_seqlens_q", "(batch + 1)"));
  const int64_t b = seq_lens.shape[0];
  if (cu_seqlens_q.shape[0] != b + 1) {
    return Status::Invalid("cu_seqlens_q: expected shape (" + std::to_string(b + 1) +
                           ") (batch + 1), got " + cu_seqlens_q.shape_str());
  }
  if (h < 1 || kv_heads < 1 || head_dim < 1) {
    return Status::Invalid("q: heads, kv heads and head_dim must be >= 1");
  }
  PagedPrefillLayout& x = *layout;
  x = PagedPrefillLayout{};
  x.b = b;
  x.h = h;
  x.kv_heads = kv_heads;
  x.head_dim = head_dim;
  for (auto* v : {&x.cu_q, &x.cu_q_tiles, &x.cu_k, &x.cu_k_tiles, &x.cu_v}) v->assign(b + 1, 0);
  if (at(cu_seqlens_q, 0) != 0) {
    return Status::Invalid("cu_seqlens_q[0]: expected 0, got " +
                           std::to_string(at(cu_seqlens_q, 0)));
  }
  for (int64_t i = 0; i < b; ++i) {
    const int64_t nq = at(cu_seqlens_q, i + 1) - at(cu_seqlens_q, i), len = at(seq_lens, i);
    std::ostringstream s;
    if (nq < 0) {
      s << "cu_seqlens_q[" << i + 1 << "]: " << at(cu_seqlens_q, i + 1) << " is below cu_seqlens_q["
        << i << "] = " << at(cu_seqlens_q, i) << " (expected non-decreasing)";
      return Status::Invalid(s.str());
    }
    if (len < 0) {
      s << "seq_lens[" << i << "]: " << len << " is negative";
      return Status::Invalid(s.str());
    }
    x.cu_q[i + 1] = x.cu_q[i] + nq;
    x.cu_q_tiles[i + 1] = x.cu_q_tiles[i] + operand_scale_tiles(nq);
    x.cu_k[i + 1] = x.cu_k[i] + len;
    x.cu_k_tiles[i + 1] = x.cu_k_tiles[i] + operand_scale_tiles(len);
    x.cu_v[i + 1] = x.cu_v[i] + operand_v_pitch(len);
  }
  int64_t off = 0;
  auto region = [&](int64_t bytes) {
    const int64_t start = off;
    off += align_up(bytes);
    return start;
  };
  x.q_data = region(x.cu_q[b] * h * head_dim);
  x.q_scale = region(4 * x.cu_q_tiles[b] * h);
  x.k_data = region(x.cu_k[b] * kv_heads * head_dim);
  x.k_scale = region(4 * x.cu_k_tiles[b] * kv_heads);
  x.v_data = region(x.cu_v[b] * kv_heads * head_dim);
  x.v_scale = region(4 * b * kv_heads * head_dim);
  x.bytes = off;
  return Status::Ok();
}

ForwardOperands paged_prefill_operands(const PagedPrefillLayout& x, void* workspace, int64_t first,
                                       int64_t n) {
  uint8_t* base = static_cast<uint8_t*>(workspace);
  const int64_t nq = x.n_q(first), len = x.len(first), d = x.head_dim;
  ForwardOperands in;
  in.q_data = make_view(base + x.q_data + x.cu_q[first] * x.h * d, DType::kE4M3, {n, x.h, nq, d});
  in.q_scale = make_view(base + x.q_scale + 4 * x.cu_q_tiles[first] * x.h, DType::kF32,
                         {n, x.h, operand_scale_tiles(nq)});
  in.k_data = make_view(base + x.k_data + x.cu_k[first] * x.kv_heads * d, DType::kE4M3,
                        {n, x.kv_heads, len, d});
  in.k_scale = make_view(base + x.k_scale + 4 * x.cu_k_tiles[first] * x.kv_heads, DType::kF32,
                         {n, x.kv_heads, operand_scale_tiles(len)});
  in.v_data = make_view(base + x.v_data + x.cu_v[first] * x.kv_heads * d, DType::kE4M3,
                        {n, x.kv_heads, d, operand_v_pitch(len)});
  in.v_scale =
      make_view(base + x.v_scale + 4 * first * x.kv_heads * d, DType::kF32, {n, x.kv_heads, d});
  return in;
}

uint8_t paged_prefill_fold_nvfp4(uint8_t code, uint8_t scale) {
  if ((scale & 0x7Fu) == 0x7Fu) return 0x7F;
  const float prod = e2m1_to_float(code) * e4m3_to_float(scale);  // exact
  return float_to_e4m3(prod / kFoldDivisor);                      // exact division by 8
}

bool paged_prefill_q_recipe_supported(Recipe r) { return r == Recipe::kFp8 || r == Recipe::kNvfp4; }

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
  // Operand factors: 8 / s_enc (FP32 division) for NVFP4, the decode scale for FP8.
  const float k_factor = fp4 ? kFoldDivisor / k_global : k_global;
  const float v_factor = fp4 ? kFoldDivisor / v_global : v_global;
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
