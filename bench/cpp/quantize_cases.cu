// The quantizer calls of the quantize suite, written against include/fp4attn/quantize_cuda.h
// (the issue-3 contract).
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/operands_cuda.h"  // quantize_operand_cuda
#include "fp4attn/quantize_cuda.h"
#include "fp4attn/recipe.h"
#include "fp4attn/scale_layout.h"
#include "quantize_cases.h"

namespace fp4attn::bench {
namespace {

// A supplied (static) NVFP4 encode scale: 448 * 6 / 4, about what the inputs' amax (< 3.5) gives.
constexpr float kSuppliedScale = 448.f * 6.f / 4.f;

// Hands out 256-byte aligned pieces of a case's output arena.
class Arena {
 public:
  explicit Arena(const CaseIO& io) : base_(io.out), size_(io.out_bytes) {}
  void* take(int64_t bytes) {
    const size_t start = (used_ + 255) / 256 * 256;
    if (bytes < 0 || start + static_cast<size_t>(bytes) > size_) {
      failed_ = true;
      return base_;
    }
    used_ = start + static_cast<size_t>(bytes);
    return base_ + start;
  }
  Status status() const {
    return failed_ ? Status::Invalid("bench: output arena too small for this case") : Status::Ok();
  }

 private:
  uint8_t* base_;
  size_t size_;
  size_t used_ = 0;
  bool failed_ = false;
};

// The input read `passes` times.
std::function<int64_t(const Shape&)> reads(int passes) {
  return [passes](const Shape& p) { return passes * p.input_bytes(); };
}

// ---- packed storage (two E2M1 per byte + scales) -----------------------------------------------

int64_t packed_bytes(const Shape& p) { return p.numel() / 2; }
int64_t scale_cols(const Shape& p, int block) { return p.d / block; }
int64_t rows(const Shape& p) { return p.b * p.s * p.h; }

QuantizeCase packed_nvfp4(const std::string& name, Nvfp4ScaleRule rule, ScaleLayout layout,
                          bool supplied) {
  QuantizeCase c;
  c.name = name;
  c.recipe = "nvfp4";
  c.form = "packed";
  c.global_scale = supplied ? "supplied" : "computed";
  c.passes = supplied ? 1 : 2;  // computed: tensor amax first
  c.bytes_read = reads(c.passes);
  c.bytes_written = [layout](const Shape& p) {
    const int64_t sf = layout == ScaleLayout::kRowMajor
                           ? rows(p) * scale_cols(p, kNvfp4Block)
                           : swizzled_scale_bytes(rows(p), scale_cols(p, kNvfp4Block));
    return packed_bytes(p) + sf + 4;
  };
  c.launch = [rule, layout, supplied](const CaseIO& io, cudaStream_t stream) {
    const Shape& p = io.shape;
    Arena a(io);
    const TensorView packed =
        make_view(a.take(packed_bytes(p)), DType::kU8, {p.b, p.s, p.h, p.d / 2});
    TensorView scales;
    if (layout == ScaleLayout::kRowMajor) {
      scales = make_view(a.take(rows(p) * scale_cols(p, kNvfp4Block)), DType::kU8,
                         {p.b, p.s, p.h, p.d / kNvfp4Block});
    } else {
      const int64_t n = swizzled_scale_bytes(rows(p), scale_cols(p, kNvfp4Block));
      scales = make_view(a.take(n), DType::kU8, {n});
    }
    const TensorView s_enc_out = make_view(a.take(4), DType::kF32, {1});
    FP4ATTN_RETURN_IF_ERROR(a.status());
    return quantize_packed_nvfp4_cuda(io.x, rule, supplied ? kSuppliedScale : 0.f, layout, packed,
                                      scales, s_enc_out, stream);
  };
  return c;
}

QuantizeCase packed_mxfp4(const std::string& name, MxScaleRule rule, ScaleLayout layout) {
  QuantizeCase c;
  c.name = name;
  c.recipe = "mxfp4";
  c.form = "packed";
  c.global_scale = "none";
  c.bytes_read = reads(1);
  c.bytes_written = [layout](const Shape& p) {
    const int64_t sf = layout == ScaleLayout::kRowMajor
                           ? rows(p) * scale_cols(p, kMxfp4Block)
                           : swizzled_scale_bytes(rows(p), scale_cols(p, kMxfp4Block));
    return packed_bytes(p) + sf;
  };
  c.launch = [rule, layout](const CaseIO& io, cudaStream_t stream) {
    const Shape& p = io.shape;
    Arena a(io);
    const TensorView packed =
        make_view(a.take(packed_bytes(p)), DType::kU8, {p.b, p.s, p.h, p.d / 2});
    TensorView scales;
    if (layout == ScaleLayout::kRowMajor) {
      scales = make_view(a.take(rows(p) * scale_cols(p, kMxfp4Block)), DType::kU8,
                         {p.b, p.s, p.h, p.d / kMxfp4Block});
    } else {
      const int64_t n = swizzled_scale_bytes(rows(p), scale_cols(p, kMxfp4Block));
      scales = make_view(a.take(n), DType::kU8, {n});
    }
    FP4ATTN_RETURN_IF_ERROR(a.status());
    return quantize_packed_mxfp4_cuda(io.x, rule, layout, packed, scales, stream);
  };
  return c;
}

// ---- kernel operands (FP4-valued E4M3 with the block scales folded in) ------------------------

int64_t operand_data_bytes(const Shape& p, OperandRole role) {
  return role == OperandRole::kV ? p.b * p.h * p.d * operand_v_pitch(p.s) : p.numel();
}
int64_t operand_scale_count(const Shape& p, OperandRole role) {
  return role == OperandRole::kV ? p.b * p.h * p.d : p.b * p.h * operand_scale_tiles(p.s);
}

const char* role_form(OperandRole role) {
  switch (role) {
    case OperandRole::kQ:
      return "operand-q";
    case OperandRole::kK:
      return "operand-k";
    case OperandRole::kV:
      return "operand-v";
  }
  return "operand";
}

// global_scale: "supplied" / "computed" for the recipes with an NVFP4 tensor scale on this role,
// "none" otherwise. passes: 2 where a scale needs a whole (b, h) slice or channel first (a
// computed s_enc, the MXFP4 fold offset, FP8 V's channel scales, K's mean), else 1.
QuantizeCase operand(const std::string& name, Recipe recipe, OperandRole role,
                     const std::string& global_scale, int passes, bool smooth_k = false) {
  QuantizeCase c;
  c.name = name;
  c.recipe = recipe_name(recipe);
  c.form = role_form(role);
  c.global_scale = global_scale;
  c.passes = passes;
  c.bytes_read = reads(passes);
  c.bytes_written = [role, smooth_k](const Shape& p) {
    return operand_data_bytes(p, role) + 4 * operand_scale_count(p, role) +
           (smooth_k ? 4 * p.b * p.h * p.d : 0);
  };
  c.launch = [recipe, role, global_scale, smooth_k](const CaseIO& io, cudaStream_t stream) {
    const Shape& p = io.shape;
    Arena a(io);
    const TensorView data =
        role == OperandRole::kV
            ? make_view(a.take(operand_data_bytes(p, role)), DType::kE4M3,
                        {p.b, p.h, p.d, operand_v_pitch(p.s)})
            : make_view(a.take(operand_data_bytes(p, role)), DType::kE4M3, {p.b, p.h, p.s, p.d});
    const TensorView scale =
        role == OperandRole::kV
            ? make_view(a.take(4 * operand_scale_count(p, role)), DType::kF32, {p.b, p.h, p.d})
            : make_view(a.take(4 * operand_scale_count(p, role)), DType::kF32,
                        {p.b, p.h, operand_scale_tiles(p.s)});
    const TensorView mean =
        smooth_k ? make_view(a.take(4 * p.b * p.h * p.d), DType::kF32, {p.b, p.h, p.d})
                 : TensorView{};
    FP4ATTN_RETURN_IF_ERROR(a.status());
    OperandOptions opt;
    opt.tensor_scale = global_scale == "supplied" ? kSuppliedScale : 0.f;
    opt.smooth_k = smooth_k;
    return quantize_operand_cuda(io.x, recipe, role, opt, data, scale, mean, stream);
  };
  return c;
}

QuantizeCase amax() {
  QuantizeCase c;
  c.name = "tensor-amax";
  c.recipe = "nvfp4";
  c.form = "amax";
  c.global_scale = "computed";
  c.bytes_read = reads(1);
  c.bytes_written = [](const Shape&) { return int64_t{4}; };
  c.launch = [](const CaseIO& io, cudaStream_t stream) {
    Arena a(io);
    const TensorView out = make_view(a.take(4), DType::kF32, {1});
    FP4ATTN_RETURN_IF_ERROR(a.status());
    return tensor_amax_cuda(io.x, out, stream);
  };
  return c;
}

}  // namespace

std::vector<QuantizeCase> quantize_cases() {
  using L = ScaleLayout;
  using R = Recipe;
  using O = OperandRole;
  return {
      packed_nvfp4("packed-nvfp4-rowmajor", Nvfp4ScaleRule::kNearest, L::kRowMajor, true),
      packed_nvfp4("packed-nvfp4-rowmajor", Nvfp4ScaleRule::kNearest, L::kRowMajor, false),
      packed_nvfp4("packed-nvfp4-swizzled", Nvfp4ScaleRule::kNearest, L::kSwizzled128x4, true),
      packed_nvfp4("packed-nvfp4-4over6", Nvfp4ScaleRule::kFourOverSix, L::kRowMajor, true),
      packed_mxfp4("packed-mxfp4-rowmajor", MxScaleRule::kOcpFloor, L::kRowMajor),
      packed_mxfp4("packed-mxfp4-swizzled", MxScaleRule::kOcpFloor, L::kSwizzled128x4),
      operand("operand-q-nvfp4", R::kNvfp4, O::kQ, "supplied", 1),
      operand("operand-q-nvfp4", R::kNvfp4, O::kQ, "computed", 2),
      operand("operand-k-nvfp4-smooth", R::kNvfp4, O::kK, "supplied", 2, /*smooth_k=*/true),
      operand("operand-q-nvfp4-hx", R::kNvfp4Hx, O::kQ, "supplied", 1),
      operand("operand-q-mxfp4", R::kMxfp4, O::kQ, "none", 2),
      operand("operand-q-fp8", R::kFp8, O::kQ, "none", 1),  // scales per 128-token tile
      operand("operand-v-fp8", R::kFp8, O::kV, "none", 2),
      operand("operand-v-nvfp4-all", R::kNvfp4All, O::kV, "supplied", 1),
      amax(),
  };
}

}  // namespace fp4attn::bench
