// Launch helpers shared by the GPU quantizers' launchers (launch_helpers.h).
#include <cuda_runtime.h>

#include <string>

#include "cuda/quantize/launch_helpers.h"

namespace fp4attn::packed {

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
      return 132;
    }
    return n;
  }();
  return sms;
}

int grid_for(int64_t items, int threads, int waves) {
  const int64_t needed = (items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * waves;
  return static_cast<int>(needed < cap ? (needed < 1 ? 1 : needed) : cap);
}

Status launch_status(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string(what) + ": CUDA error: " + cudaGetErrorString(err));
}

}  // namespace fp4attn::packed
