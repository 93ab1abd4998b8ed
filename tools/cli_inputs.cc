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

}  // namespace fp4attn::cli
