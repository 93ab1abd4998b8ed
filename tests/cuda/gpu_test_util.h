// Shared by the GPU tests: skip cleanly on machines without a CUDA device (CI compiles and lists
// the tests there).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace fp4attn::testing {

inline bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace fp4attn::testing

#define SKIP_WITHOUT_GPU() \
  if (!::fp4attn::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"
