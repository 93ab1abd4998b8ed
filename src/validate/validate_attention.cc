#include "validate/validate_attention.h"

#include <cmath>
#include <sstream>
#include <string>

#include "fp4attn/operands.h"

namespace fp4attn {
namespace {

constexpr int kMaxHeadDim = 512;

// The per-tensor checks, in the order a user would fix them.
Status check_tensor(const TensorView& t, const char* name, int rank, const char* dims,
                    std::initializer_list<DType> allowed) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(t, name, rank, dims));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, allowed));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  return check_not_null(t, name);
}

bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
}

}  // namespace

Status check_head_dim(int64_t d, std::initializer_list<int> allowed_d, const char* name) {
  std::ostringstream s;
  if (allowed_d.size() == 0) {
    if (d >= 1 && d <= kMaxHeadDim) return Status::Ok();
    s << name << ": head_dim " << d << " is not supported (supported: 1.." << kMaxHeadDim << ")";
    return Status::Invalid(s.str());
  }
  for (int a : allowed_d) {
    if (a == d) return Status::Ok();
  }
  s << name << ": head_dim " << d << " is not supported (supported: ";
  const char* sep = "";
  for (int a : allowed_d) {
    s << sep << a;
    sep = ", ";
  }
  s << ")";
  return Status::Invalid(s.str());
}

Status check_operand_head_dim(int64_t d, const char* name) {
  if (operand_head_dim_supported(d)) return Status::Ok();
  std::ostringstream s;
  s << name << ": head_dim " << d << " is not supported (supported: ";
  const char* sep = "";
  for (int64_t a : kOperandHeadDims) {
    s << sep << a;
    sep = ", ";
  }
  s << ")";
  return Status::Invalid(s.str());
}

Status validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView& lse,
                          std::initializer_list<DType> allowed_in,
                          std::initializer_list<DType> allowed_out,
                          std::initializer_list<int> allowed_d, AttentionShape* shape) {
  FP4ATTN_RETURN_IF_ERROR(
      validate_attention(q, k, v, o, lse, allowed_in, allowed_out, allowed_d, shape, "o"));
  FP4ATTN_RETURN_IF_ERROR(check_output_strides(o, "o"));
  return lse.defined() ? check_output_strides(lse, "lse") : Status::Ok();
}

Status validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView& lse,
                          std::initializer_list<DType> allowed_in,
                          std::initializer_list<DType> allowed_out,
                          std::initializer_list<int> allowed_d, AttentionShape* shape,
                          const char* o_name) {
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(q, "q", 4, "(batch, seqlen_q, heads, head_dim)", allowed_in));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(k, "k", 4, "(batch, seqlen_k, kv_heads, head_dim)", allowed_in));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(v, "v", 4, "(batch, seqlen_k, kv_heads, head_dim)", allowed_in));
  FP4ATTN_RETURN_IF_ERROR(
      check_tensor(o, o_name, 4, "(batch, seqlen_q, heads, head_dim)", allowed_out));
  if (lse.defined()) {
    FP4ATTN_RETURN_IF_ERROR(
        check_tensor(lse, "lse", 3, "(batch, heads, seqlen_q)", {DType::kF32, DType::kF64}));
  }

  const int64_t b = q.shape[0], s_q = q.shape[1], h = q.shape[2], d = q.shape[3];
  const int64_t s_k = k.shape[1], h_kv = k.shape[2];
  std::ostringstream s;
  if (k.shape[0] != b || k.shape[3] != d) {
    s << "k: expected shape (b=" << b << ", s_k, h_kv, d=" << d << ") like q, got "
      << k.shape_str();
    return Status::Invalid(s.str());
  }
  if (!same_shape(v, k)) {
    s << "v: expected shape " << k.shape_str() << " like k, got " << v.shape_str();
    return Status::Invalid(s.str());
  }
  if (h_kv == 0 && h > 0) {
    s << "k: number of kv heads is 0 but q has " << h << " heads";
    return Status::Invalid(s.str());
  }
  if (h_kv > 0 && h % h_kv != 0) {
    s << "q/k: number of heads " << h << " is not a multiple of kv heads " << h_kv;
    return Status::Invalid(s.str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_head_dim(d, allowed_d, "q"));
  if (!same_shape(o, q)) {
    s << o_name << ": expected shape " << q.shape_str() << " like q, got " << o.shape_str();
    return Status::Invalid(s.str());
  }
  if (lse.defined() && (lse.shape[0] != b || lse.shape[1] != h || lse.shape[2] != s_q)) {
    s << "lse: expected shape (b, h, s_q) = (" << b << ", " << h << ", " << s_q << "), got "
      << lse.shape_str();
    return Status::Invalid(s.str());
  }
  *shape = AttentionShape{b, s_q, s_k, h, h_kv, d};
  return Status::Ok();
}

Status check_like(const TensorView& t, const char* name, const TensorView& like,
                  const char* like_name, std::initializer_list<DType> allowed) {
  if (!same_shape(t, like)) {
    std::ostringstream s;
    s << name << ": expected shape " << like.shape_str() << " like " << like_name << ", got "
      << t.shape_str();
    return Status::Invalid(s.str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, allowed));
  FP4ATTN_RETURN_IF_ERROR(check_strides(t, name));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(t, name));
  return check_output_strides(t, name);
}

Status check_output_strides(const TensorView& t, const char* name) {
  if (t.numel() == 0) return Status::Ok();  // nothing is written (make_view gives such strides 0)
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] == 0 && t.shape[i] > 1) {
      std::ostringstream s;
      s << name << ": stride 0 in dimension " << i << " (size " << t.shape[i]
        << ") would make output elements overlap";
      return Status::Invalid(s.str());
    }
  }
  return Status::Ok();
}

Status check_recipe_value(Recipe recipe) {
  if (recipe_is_valid(recipe)) return Status::Ok();
  return Status::Invalid("recipe: unknown recipe value " +
                         std::to_string(static_cast<int>(recipe)));
}

Status resolve_softmax_scale(double softmax_scale, int64_t d, double* out) {
  if (softmax_scale == 0) {
    if (d <= 0) {
      return Status::Invalid("softmax_scale: cannot default to 1/sqrt(head_dim) with head_dim " +
                             std::to_string(d));
    }
    *out = 1.0 / std::sqrt(static_cast<double>(d));
    return Status::Ok();
  }
  if (!std::isfinite(softmax_scale) || softmax_scale < 0) {
    std::ostringstream s;
    s << "softmax_scale: expected a finite value > 0, got " << softmax_scale;
    return Status::Invalid(s.str());
  }
  *out = softmax_scale;
  return Status::Ok();
}

}  // namespace fp4attn
