// Builds without CUDA: the decode kernel is never available.
#include "gpu/decode_gpu.h"

namespace fp4attn::cli {

std::string decode_gpu_unavailable_reason() {
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
}

Status run_decode_gpu(const PagedKvCache&, const TensorView&, const TensorView&, const TensorView&,
                      const PagedAttentionOptions&, const TensorView&, double*) {
  return Status::Invalid("backend: " + decode_gpu_unavailable_reason());
}

}  // namespace fp4attn::cli
