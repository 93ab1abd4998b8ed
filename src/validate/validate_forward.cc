#include "validate/validate_forward.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

Status check_aligned(const void* p, const char* name, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    return Status::Invalid(std::string(name) + ": expected a " + std::to_string(bytes) +
                           "-byte aligned pointer");
  }
  return Status::Ok();
}

Status check_options(const ForwardOptions& opt) {
  if (!recipe_has_gpu_forward(opt.recipe)) {
    return Status::Unsupported(
        std::string("recipe: '") + recipe_name(opt.recipe) +
        "' does not run on the GPU engine (supported: " + gpu_recipe_names() + ")");
  }
  if (!std::isfinite(opt.softmax_scale) || opt.softmax_scale < 0) {
    return Status::Invalid(
        "softmax_scale: expected a finite value > 0 (0 = "
        "1/sqrt(head_dim)), got " +
        std::to_string(opt.softmax_scale));
  }
  return Status::Ok();
}

}  // namespace

Status check_row_stats(const TensorView& t, const char* name, const ForwardShape& sh) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(t, name, 3, "(batch, heads, seqlen_q)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, {DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(t, name));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  if (t.shape[0] != sh.b || t.shape[1] != sh.h || t.shape[2] != sh.s_q) {
    return Status::Invalid(std::string(name) + ": expected shape (" + str(sh.b) + ", " + str(sh.h) +
                           ", " + str(sh.s_q) + "), got " + t.shape_str());
  }
  return Status::Ok();
}

namespace {

// o [b, s_q, h, d] BF16/FP16 with d contiguous and 4-byte aligned rows; lse
// FP32 [b, h, s_q].
Status check_outputs(const TensorView& o, const TensorView& lse, const ForwardShape& sh) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(o, "o", 4, "(batch, seqlen_q, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(o, "o", {DType::kBF16, DType::kF16}));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(o, "o"));
  FP4ATTN_RETURN_IF_ERROR(check_strides(o, "o"));
  const int64_t want[4] = {sh.b, sh.s_q, sh.h, sh.d};
  for (int i = 0; i < 4; ++i) {
    if (o.shape[i] != want[i]) {
      return Status::Invalid("o: expected shape (" + str(sh.b) + ", " + str(sh.s_q) + ", " +
                             str(sh.h) + ", " + str(sh.d) + "), got " + o.shape_str());
    }
  }
  if (o.stride[0] % 2 || o.stride[1] % 2 || o.stride[2] % 2) {
    return Status::Invalid("o: batch, seqlen and head strides must be even (pairs are stored)");
  }
  FP4ATTN_RETURN_IF_ERROR(check_aligned(o.data, "o", 4));
  if (lse.defined()) FP4ATTN_RETURN_IF_ERROR(check_row_stats(lse, "lse", sh));
  return Status::Ok();
}

Status check_heads(int64_t h, int64_t h_kv) {
  if (h_kv <= 0 || h % h_kv != 0) {
    return Status::Invalid("k: kv heads (" + str(h_kv) + ") must divide the query heads (" +
                           str(h) + ")");
  }
  return Status::Ok();
}

// The kernel indexes rows and tiles with 32-bit ints.
Status check_sizes(const ForwardShape& sh) {
  const int64_t kMax = int64_t(1) << 30;
  const int64_t q_tiles = (sh.s_q + 127) / 128 * sh.b * sh.h;
  if (sh.s_q >= kMax || sh.s_k >= kMax || sh.b * sh.h >= (int64_t(1) << 31) ||
      q_tiles >= (int64_t(1) << 31)) {
    return Status::Invalid("q: sequence length or batch x heads too large for the kernel");
  }
  return Status::Ok();
}

}  // namespace

Status validate_forward_operands(const ForwardOperands& in, const ForwardOptions& opt,
                                 const TensorView& o, const TensorView& lse, ForwardShape* shape) {
  FP4ATTN_RETURN_IF_ERROR(check_options(opt));
  FP4ATTN_RETURN_IF_ERROR(check_rank(in.q_data, "q_data", 4, "(batch, heads, seqlen, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_rank(in.k_data, "k_data", 4, "(batch, heads, seqlen, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(
      check_rank(in.v_data, "v_data", 4, "(batch, heads, head_dim, seqlen_pad)"));
  ForwardShape sh;
  sh.b = in.q_data.shape[0];
  sh.h = in.q_data.shape[1];
  sh.s_q = in.q_data.shape[2];
  sh.d = in.q_data.shape[3];
  sh.h_kv = in.k_data.shape[1];
  sh.s_k = in.k_data.shape[2];
  FP4ATTN_RETURN_IF_ERROR(check_operand_head_dim(sh.d, "q_data"));
  if (in.k_data.shape[0] != sh.b) {
    return Status::Invalid("k_data: batch " + str(in.k_data.shape[0]) + " differs from q_data's " +
                           str(sh.b));
  }
  FP4ATTN_RETURN_IF_ERROR(check_heads(sh.h, sh.h_kv));
  const DType qk_type = operand_data_dtype(opt.recipe, OperandRole::kQ);
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.q_data, "q_data", {sh.b, sh.h, sh.s_q, sh.d}, qk_type));
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.k_data, "k_data", {sh.b, sh.h_kv, sh.s_k, sh.d}, qk_type));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.v_data, "v_data", {sh.b, sh.h_kv, sh.d, operand_v_pitch(sh.s_k)}, DType::kE4M3));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.q_scale, "q_scale", {sh.b, sh.h, operand_scale_tiles(sh.s_q)}, DType::kF32));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(
      in.k_scale, "k_scale", {sh.b, sh.h_kv, operand_scale_tiles(sh.s_k)}, DType::kF32));
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(in.v_scale, "v_scale", {sh.b, sh.h_kv, sh.d}, DType::kF32));
  // TMA reads 16-byte aligned global tensors.
  FP4ATTN_RETURN_IF_ERROR(check_aligned(in.q_data.data, "q_data", 16));
  FP4ATTN_RETURN_IF_ERROR(check_aligned(in.k_data.data, "k_data", 16));
  FP4ATTN_RETURN_IF_ERROR(check_aligned(in.v_data.data, "v_data", 16));
  FP4ATTN_RETURN_IF_ERROR(check_sizes(sh));
  FP4ATTN_RETURN_IF_ERROR(check_outputs(o, lse, sh));
  *shape = sh;
  return Status::Ok();
}

Status validate_forward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse, ForwardShape* shape) {
  FP4ATTN_RETURN_IF_ERROR(check_options(opt));
  const char* names[3] = {"q", "k", "v"};
  const TensorView* ts[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(*ts[i], names[i], 4, "(batch, seqlen, heads, head_dim)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(*ts[i], names[i], {DType::kBF16, DType::kF16}));
    FP4ATTN_RETURN_IF_ERROR(check_not_null(*ts[i], names[i]));
    FP4ATTN_RETURN_IF_ERROR(check_strides(*ts[i], names[i]));
  }
  ForwardShape sh;
  sh.b = q.shape[0];
  sh.s_q = q.shape[1];
  sh.h = q.shape[2];
  sh.d = q.shape[3];
  sh.s_k = k.shape[1];
  sh.h_kv = k.shape[2];
  FP4ATTN_RETURN_IF_ERROR(check_operand_head_dim(sh.d, "q"));
  for (int i = 1; i < 3; ++i) {
    if (ts[i]->dtype != q.dtype) {
      return Status::Invalid(std::string(names[i]) + ": dtype " + dtype_name(ts[i]->dtype) +
                             " differs from q's " + dtype_name(q.dtype));
    }
    if (ts[i]->shape[0] != sh.b) {
      return Status::Invalid(std::string(names[i]) + ": batch " + str(ts[i]->shape[0]) +
                             " differs from q's " + str(sh.b));
    }
    if (ts[i]->shape[3] != sh.d) {
      return Status::Invalid(std::string(names[i]) + ": head_dim " + str(ts[i]->shape[3]) +
                             " differs from q's " + str(sh.d));
    }
  }
  if (v.shape[1] != sh.s_k || v.shape[2] != sh.h_kv) {
    return Status::Invalid("v: expected (seqlen, heads) = (" + str(sh.s_k) + ", " + str(sh.h_kv) +
                           ") like k, got " + v.shape_str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_heads(sh.h, sh.h_kv));
  FP4ATTN_RETURN_IF_ERROR(check_sizes(sh));
  FP4ATTN_RETURN_IF_ERROR(check_outputs(o, lse, sh));
  if (o.dtype != q.dtype) {
    return Status::Invalid(std::string("o: dtype ") + dtype_name(o.dtype) + " differs from q's " +
                           dtype_name(q.dtype));
  }
  *shape = sh;
  return Status::Ok();
}

Status validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                               int64_t batch, const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse) {
  FP4ATTN_RETURN_IF_ERROR(check_options(opt));
  const char* names[4] = {"q", "k", "v", "o"};
  const TensorView* ts[4] = {&q, &k, &v, &o};
  for (int i = 0; i < 4; ++i) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(*ts[i], names[i], 3, "(total_tokens, heads, head_dim)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(*ts[i], names[i], {DType::kBF16, DType::kF16}));
    FP4ATTN_RETURN_IF_ERROR(check_strides(*ts[i], names[i]));
  }
  if (batch < 0) return Status::Invalid("batch: expected >= 0, got " + str(batch));
  if (batch > 0 && (cu_seqlens_q == nullptr || cu_seqlens_k == nullptr)) {
    return Status::Invalid("cu_seqlens_q: expected host arrays of batch + 1 offsets");
  }
  const int64_t total_q = q.shape[0], total_k = k.shape[0];
  const char* cu_names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  const int32_t* cus[2] = {cu_seqlens_q, cu_seqlens_k};
  const int64_t totals[2] = {total_q, total_k};
  for (int c = 0; c < 2 && batch > 0; ++c) {
    if (cus[c][0] != 0) return Status::Invalid(std::string(cu_names[c]) + ": must start at 0");
    for (int64_t i = 0; i < batch; ++i) {
      if (cus[c][i + 1] < cus[c][i]) {
        return Status::Invalid(std::string(cu_names[c]) + ": offsets must not decrease (entry " +
                               str(i + 1) + ")");
      }
    }
    if (cus[c][batch] > totals[c]) {
      return Status::Invalid(std::string(cu_names[c]) + ": last offset " + str(cus[c][batch]) +
                             " exceeds the " + str(totals[c]) + " tokens of " +
                             (c == 0 ? "q" : "k"));
    }
  }
  const int64_t h = q.shape[1], d = q.shape[2], h_kv = k.shape[1];
  FP4ATTN_RETURN_IF_ERROR(check_operand_head_dim(d, "q"));
  FP4ATTN_RETURN_IF_ERROR(check_heads(h, h_kv));
  for (int i = 1; i < 3; ++i) {
    if (ts[i]->dtype != q.dtype) {
      return Status::Invalid(std::string(names[i]) + ": dtype " + dtype_name(ts[i]->dtype) +
                             " differs from q's " + dtype_name(q.dtype));
    }
    if (ts[i]->shape[2] != d) {
      return Status::Invalid(std::string(names[i]) + ": head_dim " + str(ts[i]->shape[2]) +
                             " differs from q's " + str(d));
    }
  }
  if (v.shape[0] != total_k || v.shape[1] != h_kv) {
    return Status::Invalid("v: expected (total_k, heads) = (" + str(total_k) + ", " + str(h_kv) +
                           ") like k, got " + v.shape_str());
  }
  if (o.shape[0] != total_q || o.shape[1] != h || o.shape[2] != d || o.dtype != q.dtype) {
    return Status::Invalid("o: expected " + std::string(dtype_name(q.dtype)) + " (" + str(total_q) +
                           ", " + str(h) + ", " + str(d) + "), got " + dtype_name(o.dtype) + " " +
                           o.shape_str());
  }
  if (lse.defined()) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(lse, "lse", 2, "(heads, total_q)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(lse, "lse", {DType::kF32}));
    FP4ATTN_RETURN_IF_ERROR(check_strides(lse, "lse"));
    if (lse.shape[0] != h || lse.shape[1] != total_q) {
      return Status::Invalid("lse: expected shape (" + str(h) + ", " + str(total_q) + "), got " +
                             lse.shape_str());
    }
  }
  return Status::Ok();
}

}  // namespace fp4attn
