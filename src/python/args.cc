#include "python/args.h"

#include <string>

namespace fp4attn::py {

TensorView operand_data_view(const Array& a, const char* name, Recipe recipe, OperandRole role) {
  return to_view(a, name, operand_data_dtype(recipe, role) == DType::kE4M3);
}

ForwardOperands operand_views(const Array& q_data, const Array& q_scale, const Array& k_data,
                              const Array& k_scale, const Array& v_data, const Array& v_scale,
                              Recipe recipe) {
  return {
      operand_data_view(q_data, "q_data", recipe, OperandRole::kQ), to_view(q_scale, "q_scale"),
      operand_data_view(k_data, "k_data", recipe, OperandRole::kK), to_view(k_scale, "k_scale"),
      operand_data_view(v_data, "v_data", recipe, OperandRole::kV), to_view(v_scale, "v_scale")};
}

Recipe recipe_arg(const std::string& name) {
  Recipe r;
  if (parse_recipe(name, &r)) return r;
  std::string known;
  for (Recipe k : kAllRecipes) known += std::string(known.empty() ? "" : ", ") + recipe_name(k);
  throw nb::value_error(("recipe: unknown recipe '" + name + "' (known: " + known + ")").c_str());
}

DSource d_source_arg(const std::string& name) {
  if (name == "forward-o") return DSource::kForwardO;
  if (name == "high-precision-o") return DSource::kHighPrecisionO;
  throw nb::value_error(
      ("d_source: expected 'forward-o' or 'high-precision-o', got '" + name + "'").c_str());
}

OperandRole role_arg(const std::string& name) {
  if (name == "q") return OperandRole::kQ;
  if (name == "k") return OperandRole::kK;
  if (name == "v") return OperandRole::kV;
  throw nb::value_error(("role: expected 'q', 'k' or 'v', got '" + name + "'").c_str());
}

KvCacheFormat kv_format_arg(const std::string& name) {
  if (name == "nvfp4") return KvCacheFormat::kNvfp4;
  if (name == "fp8") return KvCacheFormat::kFp8;
  throw nb::value_error(("format: expected 'nvfp4' or 'fp8', got '" + name + "'").c_str());
}

Nvfp4ScaleRule scale_rule_arg(const std::string& name) {
  std::string known;
  for (Nvfp4ScaleRule r : kNvfp4ScaleRules) {
    if (name == scale_rule_name(r)) return r;
    known += std::string(known.empty() ? "" : ", ") + scale_rule_name(r);
  }
  throw nb::value_error(
      ("rule: unknown NVFP4 scale rule '" + name + "' (known: " + known + ")").c_str());
}

bool packed_nvfp4_arg(const std::string& format) {
  if (format == "nvfp4") return true;
  if (format == "mxfp4") return false;
  throw nb::value_error(("format: expected 'nvfp4' or 'mxfp4', got '" + format + "'").c_str());
}

MxScaleRule mx_rule_arg(const std::string& name) {
  if (name == "ocp-floor") return MxScaleRule::kOcpFloor;
  if (name == "round-up") return MxScaleRule::kRoundUp;
  throw nb::value_error(
      ("rule: unknown MXFP4 scale rule '" + name + "' (known: ocp-floor, round-up)").c_str());
}

PagedKvCache paged_cache_arg(const Array& k_data, const Array& v_data, const OptArray& k_scales,
                             const OptArray& v_scales, const Array& k_global, const Array& v_global,
                             const std::string& format, const std::string& rule) {
  PagedKvCache c;
  c.format = kv_format_arg(format);
  c.rule = scale_rule_arg(rule);
  const bool fp8 = c.format == KvCacheFormat::kFp8;
  if (fp8 && (k_scales || v_scales)) {
    throw nb::value_error(k_scales ? "k_scales: must be None for an FP8 cache"
                                   : "v_scales: must be None for an FP8 cache");
  }
  if (!fp8 && (!k_scales || !v_scales)) {
    throw nb::value_error(!k_scales ? "k_scales: required for an NVFP4 cache"
                                    : "v_scales: required for an NVFP4 cache");
  }
  c.k_data = to_view(k_data, "k_data", fp8);
  c.v_data = to_view(v_data, "v_data", fp8);
  c.k_scales = optional_view(k_scales, "k_scales", true);
  c.v_scales = optional_view(v_scales, "v_scales", true);
  c.k_global = to_view(k_global, "k_global");
  c.v_global = to_view(v_global, "v_global");
  return c;
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
