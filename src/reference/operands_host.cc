// Host reference of the kernel operands: the golden model's folded operands (golden_operands)
// written out as bytes in the kernel layouts of include/fp4attn/operands.h (V in the permuted key
// order of operand_v_position_of).
#include <cstring>
#include <string>

#include "core/half.h"
#include "core/parallel.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/operands.h"
#include "reference/golden_operands.h"
#include "validate/validate_operands.h"

namespace fp4attn {
namespace {

// Writes one operand value (an exact E4M3, INT8 or BF16 value) as its code.
void store_code(const TensorView& data, int64_t offset, double value) {
  if (data.dtype == DType::kBF16) {
    static_cast<uint16_t*>(data.data)[offset] = float_to_bf16_bits(static_cast<float>(value));
  } else if (data.dtype == DType::kI8) {
    static_cast<int8_t*>(data.data)[offset] = static_cast<int8_t>(value);  // an exact integer
  } else {
    static_cast<uint8_t*>(data.data)[offset] = float_to_e4m3(static_cast<float>(value));
  }
}

}  // namespace

Status quantize_operand_host(const TensorView& x, Recipe recipe, OperandRole role,
                             const OperandOptions& opt, const TensorView& data,
                             const TensorView& scale, const TensorView& mean) {
  FP4ATTN_RETURN_IF_ERROR(validate_operand(x, recipe, role, opt, data, scale, mean,
                                           {DType::kBF16, DType::kF16, DType::kF32}));
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  const bool is_v = role == OperandRole::kV;
  const Emulation emu = Emulation::kFoldedE4M3;
  parallel_for(b * h, [&](int64_t bh) {
    const int64_t bi = bh / h, hi = bh % h;
    golden::HeadMatrix m = golden::gather_head(x, bi, hi);
    if (!is_v && k_is_smoothed(recipe, opt.smooth_k) && role == OperandRole::kK) {
      std::vector<double> mu = golden::smooth_keys(&m);
      for (int64_t c = 0; c < d; ++c) mean.as<float>()[bh * d + c] = static_cast<float>(mu[c]);
    }
    float* sc = scale.as<float>();
    if (is_v) {
      const golden::Operand op = golden::prepare_v(m, recipe, emu, opt.tensor_scale);
      const int64_t pitch = operand_v_pitch(s);
      for (int64_t c = 0; c < d; ++c) {
        const int64_t row = (bh * d + c) * pitch;
        // Key t goes to its permuted position (operands.h); padding keys are 0.
        for (int64_t t = 0; t < pitch; ++t)
          store_code(data, row + operand_v_position_of(t), t < s ? op.val[t * d + c] : 0);
        sc[bh * d + c] = static_cast<float>(op.factor[c]);
      }
    } else {
      const golden::Operand op = golden::prepare_qk(m, recipe, emu, opt.tensor_scale);
      for (int64_t i = 0; i < s * d; ++i) store_code(data, bh * s * d + i, op.val[i]);
      const int64_t tiles = operand_scale_tiles(s);
      for (int64_t t = 0; t < tiles; ++t) {
        sc[bh * tiles + t] = static_cast<float>(op.factor[t * kOperandTileTokens]);
      }
    }
  });
  return Status::Ok();
}

}  // namespace fp4attn
