#include "python/packed_host.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"

namespace fp4attn::py {
namespace {

constexpr float kNvfp4FoldDivisor = 8.f;  // golden_operands.cc

// Checks x and the outputs; returns the float values of x, row-major [b * s * h, d].
Status gather_rows(const TensorView& x, int64_t block, const TensorView& packed,
                   const TensorView& scales, std::vector<float>* rows_out) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(x, "x", 4, "(batch, seqlen, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(x, "x", {DType::kF32, DType::kBF16, DType::kF16}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(x, "x"));
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  if (d % block != 0) {
    return Status::Invalid("x: head_dim (" + std::to_string(d) +
                           ") must be a multiple of the block size " + std::to_string(block));
  }
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(packed, "packed", {b, s, h, d / 2}, DType::kU8));
  FP4ATTN_RETURN_IF_ERROR(
      check_contiguous_shape(scales, "scales", {b, s, h, d / block}, DType::kU8));
  if (x.numel() > 0) FP4ATTN_RETURN_IF_ERROR(check_not_null(x, "x"));
  rows_out->resize(static_cast<size_t>(b * s * h * d));
  float* out = rows_out->data();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t si = 0; si < s; ++si) {
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t base = bi * x.stride[0] + si * x.stride[1] + hi * x.stride[2];
        for (int64_t c = 0; c < d; ++c) {
          *out++ = static_cast<float>(load_as_double(x, base + c * x.stride[3]));
        }
      }
    }
  }
  return Status::Ok();
}

// NaN-propagating max |x| (the golden model's slice amax).
float amax_of(const std::vector<float>& x) {
  float amax = 0.f;
  for (float v : x) {
    if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

// Whether the recipe's Q/K operand comes from that FP4 format (operands.h), so packed FP4 of it
// folds without requantizing.
bool qk_from_packed(bool nvfp4, Recipe r) {
  Nvfp4ScaleRule nv;
  MxScaleRule mx;
  return nvfp4 ? operand_nvfp4_rule(r, OperandRole::kK, &nv)
               : operand_mxfp4_rule(r, OperandRole::kK, &mx);
}

}  // namespace

Status quantize_packed_nvfp4_host(const TensorView& x, Nvfp4ScaleRule rule, float s_enc,
                                  const TensorView& packed, const TensorView& scales,
                                  const TensorView& s_enc_out) {
  std::vector<float> rows;
  FP4ATTN_RETURN_IF_ERROR(gather_rows(x, kNvfp4Block, packed, scales, &rows));
  if (!std::isfinite(s_enc) || s_enc < 0.f) {
    return Status::Invalid("s_enc: must be finite and >= 0 (0: from the amax of x), got " +
                           std::to_string(s_enc));
  }
  if (s_enc_out.defined()) {
    FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(s_enc_out, "s_enc_out", {1}, DType::kF32));
  }
  if (s_enc == 0.f) s_enc = nvfp4_tensor_scale(amax_of(rows), rule);
  const int64_t d = x.shape[3], n_rows = x.numel() / std::max<int64_t>(d, 1);
  if (n_rows > 0 && d > 0) {
    std::vector<uint8_t> codes(rows.size());
    nvfp4_quantize_rows(rows.data(), n_rows, d, d, s_enc, rule, codes.data(), scales.as<uint8_t>());
    pack_e2m1_rows(codes.data(), n_rows, d, packed.as<uint8_t>());
  }
  if (s_enc_out.defined()) *s_enc_out.as<float>() = s_enc;
  return Status::Ok();
}

Status quantize_packed_mxfp4_host(const TensorView& x, MxScaleRule rule, const TensorView& packed,
                                  const TensorView& scales) {
  std::vector<float> rows;
  FP4ATTN_RETURN_IF_ERROR(gather_rows(x, kMxfp4Block, packed, scales, &rows));
  const int64_t d = x.shape[3], n_rows = x.numel() / std::max<int64_t>(d, 1);
  if (n_rows > 0 && d > 0) {
    std::vector<uint8_t> codes(rows.size());
    mxfp4_quantize_rows(rows.data(), n_rows, d, d, rule, codes.data(), scales.as<uint8_t>());
    pack_e2m1_rows(codes.data(), n_rows, d, packed.as<uint8_t>());
  }
  return Status::Ok();
}

Status check_exact_repack(bool nvfp4, Recipe recipe, OperandRole role) {
  const bool qk = role == OperandRole::kQ || role == OperandRole::kK;
  const bool ok = qk && qk_from_packed(nvfp4, recipe);
  if (ok) return Status::Ok();
  return Status::Unsupported(
      std::string("recipe/role: packed ") + (nvfp4 ? "NVFP4" : "MXFP4") + " folds into the " +
      recipe_name(recipe) + (qk ? " Q/K" : " V") +
      " operand only by requantizing (not bit-exact); the exact repack covers Q/K of the nvfp4 "
      "recipes and fp4-direct (NVFP4) and of mxfp4 (MXFP4)");
}

Status repack_to_operand_host(const TensorView& packed, const TensorView& scales, bool nvfp4,
                              float s_enc, Recipe recipe, OperandRole role, const TensorView& data,
                              const TensorView& scale) {
  FP4ATTN_RETURN_IF_ERROR(check_exact_repack(nvfp4, recipe, role));
  FP4ATTN_RETURN_IF_ERROR(check_rank(packed, "packed", 4, "(batch, seqlen, heads, head_dim / 2)"));
  const int64_t b = packed.shape[0], s = packed.shape[1], h = packed.shape[2];
  const int64_t d = 2 * packed.shape[3], block = nvfp4 ? kNvfp4Block : kMxfp4Block;
  if (d % block != 0) {
    return Status::Invalid("packed: head_dim (2 * " + std::to_string(packed.shape[3]) +
                           ") must be a multiple of the block size " + std::to_string(block));
  }
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(packed, "packed", {b, s, h, d / 2}, DType::kU8));
  const int64_t sf_cols = d / block;
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(scales, "scales", {b, s, h, sf_cols}, DType::kU8));
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(data, "data", {b, h, s, d}, DType::kE4M3));
  const int64_t tiles = operand_scale_tiles(s);
  FP4ATTN_RETURN_IF_ERROR(check_contiguous_shape(scale, "scale", {b, h, tiles}, DType::kF32));
  if (nvfp4 && (!std::isfinite(s_enc) || !(s_enc > 0.f))) {
    return Status::Invalid("s_enc: must be finite and > 0, got " + std::to_string(s_enc));
  }
  const uint8_t* pk = packed.as<uint8_t>();
  const uint8_t* sc = scales.as<uint8_t>();
  uint8_t* out = data.as<uint8_t>();
  float* factor = scale.as<float>();
  // MXFP4: the fold offset t of each (b, h) slice, from its largest non-NaN block exponent.
  std::vector<int> t(static_cast<size_t>(b * h), 0);
  if (!nvfp4) {
    std::vector<int> top(t.size(), -1);
    for (int64_t r = 0; r < b * s * h; ++r) {
      const int64_t bh = r / (s * h) * h + r % h;
      for (int64_t j = 0; j < sf_cols; ++j) {
        const uint8_t e = sc[r * sf_cols + j];
        if (e != 0xFF) top[bh] = std::max(top[bh], static_cast<int>(e));
      }
    }
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = top[i] < 0 ? 0 : top[i] - 127 - kOperandPow2FoldTop;
  }
  for (int64_t r = 0; r < b * s * h; ++r) {
    const int64_t bi = r / (s * h), si = r / h % s, hi = r % h, bh = bi * h + hi;
    uint8_t* dst = out + (bh * s + si) * d;
    for (int64_t c = 0; c < d; ++c) {
      const uint8_t byte = pk[r * (d / 2) + c / 2];
      const uint8_t code = (c & 1) ? e2m1x2_second(byte) : e2m1x2_first(byte);
      const uint8_t e = sc[r * sf_cols + c / block];
      const double value = e2m1_to_float(code);
      if (nvfp4) {
        // As golden_operands.cc: the product is exact in double, one rounding to E4M3.
        dst[c] =
            (e & 0x7F) == 0x7F
                ? 0x7F
                : float_to_e4m3(static_cast<float>(value * e4m3_to_float(e) / kNvfp4FoldDivisor));
      } else {
        dst[c] = e == 0xFF ? 0x7F
                           : float_to_e4m3(static_cast<float>(
                                 std::ldexp(value, static_cast<int>(e) - 127 - t[bh])));
      }
    }
  }
  for (int64_t bh = 0; bh < b * h; ++bh) {
    const float f = nvfp4 ? kNvfp4FoldDivisor / s_enc : static_cast<float>(std::ldexp(1.0, t[bh]));
    for (int64_t i = 0; i < tiles; ++i) factor[bh * tiles + i] = f;
  }
  return Status::Ok();
}

}  // namespace fp4attn::py
