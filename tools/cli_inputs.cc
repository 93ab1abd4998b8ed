#include "cli_inputs.h"

#include <iterator>
#include <string>

namespace fp4attn::cli {

std::vector<InputKind> parse_input_kinds(const Args& a) {
  const std::string name = a.get("input", "gaussian");
  if (name == "all") return {std::begin(kAllInputKinds), std::end(kAllInputKinds)};
  InputKind k;
  if (!parse_input_kind(name, &k)) {
    throw UsageError(
        "--input: expected gaussian, outliers, large-logits, near-uniform or all, got '" + name +
        "'");
  }
  return {k};
}

std::vector<Recipe> parse_recipes(const Args& a) {
  const std::string name = a.get("recipe", "all");
  if (name == "all") return {std::begin(kAllRecipes), std::end(kAllRecipes)};
  Recipe r;
  if (!parse_recipe(name, &r)) {
    throw UsageError("--recipe: unknown recipe '" + name + "' (see fp4attn recipes)");
  }
  return {r};
}

}  // namespace fp4attn::cli
