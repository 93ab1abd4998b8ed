// The kernel layout facts the Python package needs (operands.h, recipe.h, quantize.h), exported so
// that python/fp4attn reads them once at import instead of restating them.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>

#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands.h"
#include "fp4attn/paged_kv.h"
#include "fp4attn/recipe.h"
#include "python/args.h"
#include "python/bindings.h"

namespace fp4attn::py {
namespace {

using Fp4Rule = std::pair<std::string, std::string>;

// (format, rule name) of the FP4 quantizer behind an operand, None for E4M3/BF16 operands.
std::optional<Fp4Rule> operand_fp4_rule(const std::string& recipe, const std::string& role) {
  const Recipe r = recipe_arg(recipe);
  const OperandRole ro = role_arg(role);
  Nvfp4ScaleRule nv;
  if (operand_nvfp4_rule(r, ro, &nv)) return Fp4Rule{"nvfp4", scale_rule_name(nv)};
  MxScaleRule mx;
  if (operand_mxfp4_rule(r, ro, &mx)) return Fp4Rule{"mxfp4", scale_rule_name(mx)};
  return std::nullopt;
}

}  // namespace

void bind_layout(nb::module_& m) {
  using nb::arg;
  m.attr("OPERAND_TILE_TOKENS") = kOperandTileTokens;
  m.attr("OPERAND_TOKEN_PAD") = kOperandTokenPad;
  m.attr("OPERAND_V_KEY_GROUP") = kOperandVKeyGroup;
  nb::list head_dims;
  for (int64_t d : kOperandHeadDims) head_dims.append(d);
  m.attr("HEAD_DIMS") = nb::tuple(head_dims);
  nb::list gpu_backward;
  for (Recipe r : kGpuBackwardRecipes) gpu_backward.append(recipe_name(r));
  m.attr("GPU_BACKWARD_RECIPES") = nb::tuple(gpu_backward);
  nb::dict block;
  block["nvfp4"] = kNvfp4Block;
  block["mxfp4"] = kMxfp4Block;
  m.attr("PACKED_BLOCK") = block;
  nb::list rules;  // the names scale_rule_arg takes, in its order
  for (Nvfp4ScaleRule r : kNvfp4ScaleRules) rules.append(scale_rule_name(r));
  m.attr("NVFP4_SCALE_RULES") = nb::tuple(rules);
  nb::dict paged_errors;  // device error flag bit -> what it means (paged_kv.h)
  for (PagedError e : kPagedErrors)
    paged_errors[nb::int_(static_cast<int>(e))] = paged_error_description(e);
  m.attr("PAGED_ERRORS") = paged_errors;

  m.def("operand_v_pitch", &operand_v_pitch, arg("seqlen"),
        "Tokens of a V^T row: seqlen rounded up to OPERAND_TOKEN_PAD.");
  m.def("operand_scale_tiles", &operand_scale_tiles, arg("seqlen"),
        "Q/K scales per (batch, head): ceil(seqlen / OPERAND_TILE_TOKENS).");
  m.def(
      "operand_v_key_at", [](int64_t position) { return operand_v_key_at(position); },
      arg("position"), "The key at a position of a V^T row (keys permuted within groups).");
  m.def(
      "operand_v_position_of", [](int64_t key) { return operand_v_position_of(key); }, arg("key"),
      "The position of a key in its V^T row (the inverse of operand_v_key_at).");
  m.def(
      "operand_data_dtype",
      [](const std::string& recipe, const std::string& role) {
        return dtype_name(operand_data_dtype(recipe_arg(recipe), role_arg(role)));
      },
      arg("recipe"), arg("role"),
      "The dtype name of a role's operand data: 'float8_e4m3fn', 'int8' or 'bfloat16'.");
  m.def(
      "recipe_smooths_k",
      [](const std::string& recipe) { return recipe_smooths_k(recipe_arg(recipe)); }, arg("recipe"),
      "Whether the recipe smooths K by its mean whatever smooth_k says (int8).");
  m.def("operand_fp4_rule", &operand_fp4_rule, arg("recipe"), arg("role"),
        "('nvfp4' | 'mxfp4', scale rule name) of the FP4 quantizer behind a role's operand, or "
        "None (E4M3 and BF16 operands, fp4-direct's V).");
}

}  // namespace fp4attn::py
