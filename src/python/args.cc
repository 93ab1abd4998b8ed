#include "python/args.h"

#include <string>

namespace fp4attn::py {

Recipe recipe_arg(const std::string& name) {
  Recipe r;
  if (parse_recipe(name, &r)) return r;
  std::string known;
  for (Recipe k : kAllRecipes) known += std::string(known.empty() ? "" : ", ") + recipe_name(k);
  throw nb::value_error(("recipe: unknown recipe '" + name + "' (known: " + known + ")").c_str());
}

OperandRole role_arg(const std::string& name) {
  if (name == "q") return OperandRole::kQ;
  if (name == "k") return OperandRole::kK;
  if (name == "v") return OperandRole::kV;
  throw nb::value_error(("role: expected 'q', 'k' or 'v', got '" + name + "'").c_str());
}

TensorView optional_view(const OptArray& a, const char* name, bool as_e4m3) {
  return a ? to_view(*a, name, as_e4m3) : TensorView{};
}

void require_host(std::initializer_list<std::pair<const Array*, const char*>> arrays) {
  for (const auto& [a, name] : arrays) {
    if (!is_host(*a)) {
      throw nb::value_error((std::string(name) + ": expected a CPU tensor").c_str());
    }
  }
}

void require_cuda(std::initializer_list<std::pair<const Array*, const char*>> arrays) {
  int device = -1;
  for (const auto& [a, name] : arrays) {
    if (!is_cuda(*a)) {
      throw nb::value_error((std::string(name) + ": expected a CUDA tensor").c_str());
    }
    if (device >= 0 && a->device_id() != device) {
      throw nb::value_error((std::string(name) + ": on cuda:" + std::to_string(a->device_id()) +
                             ", the other tensors on cuda:" + std::to_string(device))
                                .c_str());
    }
    device = a->device_id();
  }
}

}  // namespace fp4attn::py
