// Checks of a PackedTensor input (packed_internal.h check_packed), shared by the dequantizer and
// the repack.
#include <cmath>
#include <string>

#include "cuda/quantize/packed_internal.h"
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/scale_layout.h"
#include "validate/validate_cuda.h"

namespace fp4attn::packed {

// Accepts packed [b, s, h, d / 2] U8 contiguous and 16-byte aligned, scales in the layout, s_enc
// finite > 0 (host value) for NVFP4. Returns b, s, h, d.
Status check_packed(const PackedTensor& in, int64_t* b, int64_t* s, int64_t* h, int64_t* d) {
  if (in.format != PackedFormat::kNvfp4 && in.format != PackedFormat::kMxfp4) {
    return Status::Invalid("in.format: unknown PackedFormat");
  }
  const TensorView& p = in.packed;
  FP4ATTN_RETURN_IF_ERROR(check_rank(p, "in.packed", 4, "(batch, seqlen, heads, head_dim / 2)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(p, "in.packed", {DType::kU8}));
  if (!p.is_contiguous()) return Status::Invalid("in.packed: must be contiguous (row-major)");
  FP4ATTN_RETURN_IF_ERROR(check_not_null(p, "in.packed"));
  if (p.numel() > 0) FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(p.data, "in.packed", 16));
  *b = p.shape[0];
  *s = p.shape[1];
  *h = p.shape[2];
  *d = 2 * p.shape[3];
  const int64_t block = in.format == PackedFormat::kNvfp4 ? kNvfp4Block : kMxfp4Block;
  if (*d % block != 0) {
    return Status::Invalid("in.packed: head_dim (2 * " + std::to_string(p.shape[3]) +
                           ") must be a multiple of the block size " + std::to_string(block));
  }
  const int64_t rows = *b * *s * *h, sf_cols = *d / block;
  const bool nv = in.format == PackedFormat::kNvfp4;
  if (in.layout != ScaleLayout::kRowMajor && in.layout != ScaleLayout::kSwizzled128x4) {
    return Status::Invalid("in.layout: unknown ScaleLayout");
  }
  const int64_t rows_pad = (rows + 127) / 128 * 128, cols_pad = (sf_cols + 3) / 4 * 4;
  const int64_t n = swizzled_scale_bytes(rows, sf_cols);
  const bool row_major = in.layout == ScaleLayout::kRowMajor;
  // (initializer lists spelled out per call: a list must not outlive its full-expression)
  if (nv && row_major) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::output(in.scales, "in.scales", {*b, *s, *h, sf_cols},
                                               {DType::kU8, DType::kE4M3}, 1));
  } else if (row_major) {
    FP4ATTN_RETURN_IF_ERROR(
        cuda_check::output(in.scales, "in.scales", {*b, *s, *h, sf_cols}, {DType::kU8}, 1));
  } else if (nv) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::output_one_of(
        in.scales, "in.scales", {{n}, {rows_pad, cols_pad}}, {DType::kU8, DType::kE4M3}, 1));
  } else {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::output_one_of(
        in.scales, "in.scales", {{n}, {rows_pad, cols_pad}}, {DType::kU8}, 1));
  }
  if (in.format == PackedFormat::kNvfp4 && in.s_enc_device == nullptr &&
      (!std::isfinite(in.s_enc) || !(in.s_enc > 0.f))) {
    return Status::Invalid("in.s_enc: must be finite and > 0, got " + std::to_string(in.s_enc));
  }
  if (in.s_enc_device != nullptr) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(in.s_enc_device, "in.s_enc_device", 4));
  }
  return Status::Ok();
}

}  // namespace fp4attn::packed
