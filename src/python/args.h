// Argument parsing shared by the bindings: recipe and role names, optional tensors, devices.
#pragma once

#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "fp4attn/operands.h"
#include "fp4attn/recipe.h"
#include "python/dlpack_view.h"

namespace fp4attn::py {

using Array = nb::ndarray<>;
using OptArray = std::optional<Array>;

// "nvfp4-hx" -> Recipe::kNvfp4Hx; ValueError listing the known names otherwise.
Recipe recipe_arg(const std::string& name);
// "q" / "k" / "v" -> OperandRole.
OperandRole role_arg(const std::string& name);

// An undefined view for None, else to_view(*a).
TensorView optional_view(const OptArray& a, const char* name, bool as_e4m3 = false);

// ValueError unless every array is on the host (CPU) / on one CUDA device.
void require_host(std::initializer_list<std::pair<const Array*, const char*>> arrays);
void require_cuda(std::initializer_list<std::pair<const Array*, const char*>> arrays);

}  // namespace fp4attn::py
