// Small host-side CUDA helpers of the CLI's GPU backends (run_gpu.cu, decode_gpu.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::cli {

// Device buffer freed on scope exit; ptr is null when the allocation failed.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, std::max<size_t>(bytes, 1)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A host F32 view holding BF16-exact values, as BF16 bits.
inline std::vector<uint16_t> to_bf16(const TensorView& t) {
  std::vector<uint16_t> r(t.numel());
  const float* x = t.as<float>();
  for (size_t i = 0; i < r.size(); ++i) r[i] = float_to_bf16_bits(x[i]);
  return r;
}

inline Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("backend: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace fp4attn::cli
