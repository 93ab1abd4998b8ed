// The parts of the _C module, each registered by its own file.
#pragma once

#include <nanobind/nanobind.h>

namespace fp4attn::py {

void bind_host(nanobind::module_& m);
// The golden backward (CPU autograd).
void bind_backward(nanobind::module_& m);
// The paged KV cache on the host: append, dequantize, golden paged attention (bind_paged.cc).
void bind_paged(nanobind::module_& m);
// Layout facts: operand tiles, V key order, head dims, recipe sets, packed blocks (bind_layout.cc).
void bind_layout(nanobind::module_& m);
// CUDA entry points (bind_cuda.cc), or, in a build without CUDA, has_cuda() alone, returning
// False (bind_cuda_stub.cc): Python checks it before calling any CUDA entry point.
void bind_cuda(nanobind::module_& m);

}  // namespace fp4attn::py
