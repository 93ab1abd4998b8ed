// Status -> Python exception: every bad argument becomes a ValueError whose text is the C++
// message (it names the argument), so Python and C++ users read the same words.
#pragma once

#include <nanobind/nanobind.h>

#include "fp4attn/status.h"

namespace fp4attn::py {

inline void throw_if_error(const Status& st) {
  if (!st.ok()) throw nanobind::value_error(st.message().c_str());
}

}  // namespace fp4attn::py
