// The forward engine's no-softmax bound (docs/benchmarks.md, "The bound"): the fp8 recipe's
// kernel with a constant P (sm90::kPConstant) in place of the whole softmax, so that timing it
// shows what the GEMMs, the pipeline and the epilogue alone cost. Wrong results by design: a
// measurement, never a library path.
#pragma once

#include <cuda_runtime_api.h>

#include "fp4attn/attention.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::bench {

// As attention_forward_operands_cuda without LSE, on fp8 operands (the exp2 kernels' layout).
Status forward_bound_operands(const ForwardOperands& in, const ForwardOptions& opt,
                              const TensorView& o, cudaStream_t stream);

}  // namespace fp4attn::bench
