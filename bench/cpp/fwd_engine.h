// One forward problem on the GPU: the kernel operands of a recipe (quantize_operand_cuda), the
// output, and the calls the fwd suite times. Written against include/fp4attn/attention_cuda.h.
#pragma once

#include <cuda_runtime.h>

#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"
#include "fwd_grid.h"
#include "timing.h"

namespace fp4attn::bench {

class FwdProblem {
 public:
  // q [b, s_q, h, d], k and v [b, s_k, h_kv, d]: BF16 BSHD device tensors that outlive this.
  // bound: forward() runs the no-softmax bound (fwd_bound.h) instead of the engine.
  FwdProblem(const FwdPoint& p, Recipe recipe, const void* q, const void* k, const void* v,
             bool bound = false);

  // Allocates the operands and the output.
  Status prepare();
  // quantize_operand_cuda of one role into its operand buffers (stream-ordered).
  Status quantize(OperandRole role, cudaStream_t stream) const;
  // attention_forward_operands_cuda (or the bound) on the operands (stream-ordered).
  Status forward(cudaStream_t stream) const;
  // o [b, s_q, h, d] BF16 on the device.
  const void* output() const { return o_.get(); }

 private:
  FwdPoint p_;
  Recipe recipe_;
  bool bound_;
  TensorView xq_, xk_, xv_;
  DeviceBuffer q_data_, q_scale_, k_data_, k_scale_, v_data_, v_scale_, o_;
  DeviceBuffer k_mean_;  // the int8 recipes' K mean (recipe_smooths_k)
};

}  // namespace fp4attn::bench
