// The parts of the _C module, each registered by its own file.
#pragma once

#include <nanobind/nanobind.h>

namespace fp4attn::py {

void bind_host(nanobind::module_& m);
// The golden backward (CPU autograd).
void bind_backward(nanobind::module_& m);
// The paged KV cache on the host: append, dequantize, golden paged attention (bind_paged.cc).
void bind_paged(nanobind::module_& m);
// CUDA entry points; without CUDA (or without the attention engine) the same names exist and
// raise, so Python code needs no import-time branches (bind_cuda.cc / bind_cuda_stub.cc).
void bind_cuda(nanobind::module_& m);

}  // namespace fp4attn::py
