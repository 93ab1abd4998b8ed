// DLPack arrays (torch, numpy, any __dlpack__ producer) as fp4attn TensorViews: the extension's
// only bridge to the caller's tensors, so the core never sees a framework type.
#pragma once

#include <nanobind/ndarray.h>

#include "fp4attn/tensor.h"

namespace fp4attn::py {

namespace nb = nanobind;

// The view of `a` named `name` in error messages. FP8 data may travel as uint8 (torch exports
// float8 through DLPack only in recent versions): `as_e4m3` retypes a uint8 array as E4M3 codes.
// Raises TypeError for a dtype without an fp4attn equivalent, ValueError for a rank above 4.
TensorView to_view(const nb::ndarray<>& a, const char* name, bool as_e4m3 = false);

// Whether `a` lives in host memory (CPU, or CUDA-host pinned), or on a CUDA device.
bool is_host(const nb::ndarray<>& a);
bool is_cuda(const nb::ndarray<>& a);

}  // namespace fp4attn::py
