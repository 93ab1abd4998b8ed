// Status -> Python exception: every bad argument becomes a ValueError whose text is the C++
// message (it names the argument), so Python and C++ users read the same words; an unsupported
// request becomes NotImplementedError (fp4attn turns it into its UnsupportedError).
#pragma once

#include <nanobind/nanobind.h>

#include "fp4attn/status.h"

namespace fp4attn::py {

inline void throw_if_error(const Status& st) {
  if (st.ok()) return;
  if (st.unsupported()) {
    PyErr_SetString(PyExc_NotImplementedError, st.message().c_str());
    throw nanobind::python_error();
  }
  throw nanobind::value_error(st.message().c_str());
}

}  // namespace fp4attn::py
