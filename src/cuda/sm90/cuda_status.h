// A CUDA runtime error as a Status (host code): every launcher reports its CUDA failures through
// this one function, naming what failed.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fp4attn/status.h"

namespace fp4attn::sm90 {

// Ok for cudaSuccess, else Invalid "<what>: CUDA error <name>: <description>".
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string(what) + ": CUDA error " + cudaGetErrorName(e) + ": " +
                         cudaGetErrorString(e));
}

// The same, prefixed by the entry point that failed: "<entry>: <what>: CUDA error ...".
inline Status cuda_status(cudaError_t e, const char* entry, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return cuda_status(e, (std::string(entry) + ": " + what).c_str());
}

}  // namespace fp4attn::sm90
