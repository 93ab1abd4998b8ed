// Built instead of bind_cuda.cc when nvcc was not found: the package then runs on the CPU only.
#include "python/bindings.h"

namespace fp4attn::py {

void bind_cuda(nanobind::module_& m) {
  m.def("has_cuda", [] { return false; });
}

}  // namespace fp4attn::py
