// The paged prefill's operand layout (paged_prefill.h): the workspace regions the GPU path and the
// host reference write, and the engine operands of a run of sequences inside it.
#include <sstream>
#include <string>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/paged_prefill.h"
#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

constexpr int64_t kRegionAlign = 256;

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
  return float_to_e4m3(prod / kPagedPrefillFoldDivisor);          // exact division by 8
}

bool paged_prefill_q_recipe_supported(Recipe r) { return r == Recipe::kFp8 || r == Recipe::kNvfp4; }

}  // namespace fp4attn
