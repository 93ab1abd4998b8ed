// Builds without CUDA: the GPU backend is never available.
#include "gpu/run_gpu.h"

namespace fp4attn::cli {

std::string gpu_unavailable_reason(Recipe) {
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
}

std::string gpu_device_name() { return ""; }

Status run_attention_gpu(const TensorView&, const TensorView&, const TensorView&, Recipe, bool,
                         double, const TensorView&, const TensorView&, double*) {
  return Status::Invalid("backend: " + gpu_unavailable_reason(Recipe::kFp8));
}

}  // namespace fp4attn::cli
