#include "cuda/fwd/launch.cuh"
#include "fp4attn/attention_cuda.h"
#include "fwd_bound.h"
#include "validate/validate_forward.h"

namespace fp4attn::bench {

Status forward_bound_operands(const ForwardOperands& in, const ForwardOptions& opt,
                              const TensorView& o, cudaStream_t stream) {
  if (opt.recipe != Recipe::kFp8) {
    return Status::Invalid("--bound: times the fp8 recipe's kernel only (its operand layout)");
  }
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_operands(in, opt, o, TensorView{}, &sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.b == 0 || sh.h == 0 || sh.s_q == 0) return Status::Ok();
  return sm90::launch_forward<sm90::kPConstant>(in, opt, sh, o, TensorView{}, TensorView{}, stream);
}

}  // namespace fp4attn::bench
