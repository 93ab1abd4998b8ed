// Argument parsing shared by the bindings: recipe and role names, optional tensors, devices.
#pragma once

#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "fp4attn/attention.h"
#include "fp4attn/attention_bwd.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/numerics/quantize.h"
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
// A recipe's operand data for `role` (operands.h): uint8 arrays read as E4M3 codes where that
// data is E4M3 (float8 DLPack export is recent); INT8 and BF16 data as they are.
TensorView operand_data_view(const Array& a, const char* name, Recipe recipe, OperandRole role);
// The six operand tensors of an attention call over kernel operands.
ForwardOperands operand_views(const Array& q_data, const Array& q_scale, const Array& k_data,
                              const Array& k_scale, const Array& v_data, const Array& v_scale,
                              Recipe recipe);

// "forward-o" / "high-precision-o" -> DSource (the backward's D, docs/numerics.md §8).
DSource d_source_arg(const std::string& name);

// "nvfp4" / "fp8" -> KvCacheFormat; "nearest", "round-up", "four-over-six", "restricted" ->
// Nvfp4ScaleRule (quantize.h's scale_rule_name). ValueError naming `format` / `rule` otherwise.
KvCacheFormat kv_format_arg(const std::string& name);
Nvfp4ScaleRule scale_rule_arg(const std::string& name);
// The rules scale_rule_arg takes, in the order its message lists them (_C.NVFP4_SCALE_RULES).
inline constexpr Nvfp4ScaleRule kNvfp4ScaleRules[] = {
    Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp, Nvfp4ScaleRule::kFourOverSix,
    Nvfp4ScaleRule::kRestricted};

// Packed FP4 storage: "nvfp4" -> true, "mxfp4" -> false (ValueError naming `format` otherwise);
// "ocp-floor" / "round-up" -> MxScaleRule (ValueError naming `rule`).
bool packed_nvfp4_arg(const std::string& format);
MxScaleRule mx_rule_arg(const std::string& name);

// The PagedKvCache over the caller's tensors (paged_kv.h): FP8 data and every scale tensor may
// be uint8 (retyped as E4M3 codes); the scales are None for an FP8 cache. The device is checked
// by the caller (require_host / require_cuda).
PagedKvCache paged_cache_arg(const Array& k_data, const Array& v_data, const OptArray& k_scales,
                             const OptArray& v_scales, const Array& k_global, const Array& v_global,
                             const std::string& format, const std::string& rule);

// An undefined view for None, else to_view(*a).
TensorView optional_view(const OptArray& a, const char* name, bool as_e4m3 = false);

// ValueError unless every array is on the host (CPU) / on one CUDA device.
void require_host(std::initializer_list<std::pair<const Array*, const char*>> arrays);
void require_cuda(std::initializer_list<std::pair<const Array*, const char*>> arrays);

}  // namespace fp4attn::py
