// fp4attn._C: the nanobind extension. Tensors come in through DLPack, so neither the core nor the
// extension depends on torch; the Python package (python/fp4attn) does the torch side.
#include "python/bindings.h"

NB_MODULE(_C, m) {
  m.doc() = "fp4attn native extension (DLPack tensors in, Status messages out as ValueError)";
  fp4attn::py::bind_host(m);
  fp4attn::py::bind_backward(m);
  fp4attn::py::bind_paged(m);
  fp4attn::py::bind_layout(m);
  fp4attn::py::bind_cuda(m);
}
