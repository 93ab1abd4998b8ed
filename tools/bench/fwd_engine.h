// One forward problem on the GPU: the kernel operands of a recipe (quantize_operand_cuda), the
// output, and the calls the fwd suite times. Written against include/fp4attn/attention_cuda.h;
// without the forward engine in this build (FP4ATTN_BENCH_HAVE_FWD unset) prepare() says so and
// the suite records the error.
#pragma once

#include <cuda_runtime.h>

#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"
#include "fwd_grid.h"
#include "timing.h"

namespace fp4attn::bench {

bool forward_engine_built();

class FwdProblem {
 public:
  // q [b, s_q, h, d], k and v [b, s_k, h_kv, d]: BF16 BSHD device tensors that outlive this.
  FwdProblem(const FwdPoint& p, Recipe recipe, const void* q, const void* k, const void* v);

  // Allocates the operands and the output; an error when the engine is not built.
  Status prepare();
  // quantize_operand_cuda of one role into its operand buffers (stream-ordered).
  Status quantize(OperandRole role, cudaStream_t stream) const;
  // attention_forward_operands_cuda on the operands (stream-ordered).
  Status forward(cudaStream_t stream) const;
  // o [b, s_q, h, d] BF16 on the device.
  const void* output() const { return o_.get(); }

 private:
  FwdPoint p_;
  Recipe recipe_;
  TensorView xq_, xk_, xv_;
  DeviceBuffer q_data_, q_scale_, k_data_, k_scale_, v_data_, v_scale_, o_;
};

}  // namespace fp4attn::bench
