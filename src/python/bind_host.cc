// Host (CPU) entry points: the golden model for attention, the host reference of the kernel
// operands, and attention over those operands.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/operands.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/packed_host.h"
#include "python/status_error.h"

namespace fp4attn::py {
namespace {

void golden_forward(const Array& q, const Array& k, const Array& v, const Array& o,
                    const OptArray& lse, const std::string& recipe, double softmax_scale,
                    bool causal, bool smooth_k) {
  require_host({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}});
  if (lse) require_host({{&*lse, "lse"}});
  RecipeOptions opt;
  opt.recipe = recipe_arg(recipe);
  opt.softmax_scale = softmax_scale;
  opt.causal = causal;
  opt.smooth_k = smooth_k;
  const TensorView qv = to_view(q, "q"), kv = to_view(k, "k"), vv = to_view(v, "v");
  const TensorView ov = to_view(o, "o"), lv = optional_view(lse, "lse");
  Status st;
  {
    nb::gil_scoped_release unlocked;  // seconds of work on big inputs
    st = golden_attention_forward(qv, kv, vv, opt, ov, lv);
  }
  throw_if_error(st);
}

void quantize_operand_host_py(const Array& x, const std::string& recipe, const std::string& role,
                              double tensor_scale, bool smooth_k, const Array& data,
                              const Array& scale, const OptArray& mean) {
  require_host({{&x, "x"}, {&data, "data"}, {&scale, "scale"}});
  if (mean) require_host({{&*mean, "mean"}});
  OperandOptions opt;
  opt.tensor_scale = static_cast<float>(tensor_scale);
  opt.smooth_k = smooth_k;
  const Recipe r = recipe_arg(recipe);
  const TensorView xv = to_view(x, "x"), dv = operand_data_view(data, "data", r, role_arg(role));
  const TensorView sv = to_view(scale, "scale"), mv = optional_view(mean, "mean");
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = quantize_operand_host(xv, r, role_arg(role), opt, dv, sv, mv);
  }
  throw_if_error(st);
}

void attention_operands_host(const Array& q_data, const Array& q_scale, const Array& k_data,
                             const Array& k_scale, const Array& v_data, const Array& v_scale,
                             const Array& o, const OptArray& lse, const std::string& recipe,
                             double softmax_scale, bool causal) {
  require_host({{&q_data, "q_data"},
                {&q_scale, "q_scale"},
                {&k_data, "k_data"},
                {&k_scale, "k_scale"},
                {&v_data, "v_data"},
                {&v_scale, "v_scale"},
                {&o, "o"}});
  if (lse) require_host({{&*lse, "lse"}});
  RecipeOptions opt;
  opt.recipe = recipe_arg(recipe);
  opt.softmax_scale = softmax_scale;
  opt.causal = causal;
  const ForwardOperands in =
      operand_views(q_data, q_scale, k_data, k_scale, v_data, v_scale, opt.recipe);
  const TensorView ov = to_view(o, "o"), lv = optional_view(lse, "lse");
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = golden_attention_forward_operands(in, opt, ov, lv);
  }
  throw_if_error(st);
}

// Packed FP4 storage (packed_host.h): format "nvfp4" (rule: scale_rule_name's) or "mxfp4" (rule
// "ocp-floor" / "round-up"; s_enc must be 0 and s_enc_out None).
void quantize_packed_host_py(const Array& x, const std::string& format, const std::string& rule,
                             double s_enc, const Array& packed, const Array& scales,
                             const OptArray& s_enc_out) {
  require_host({{&x, "x"}, {&packed, "packed"}, {&scales, "scales"}});
  if (s_enc_out) require_host({{&*s_enc_out, "s_enc_out"}});
  const bool nv = packed_nvfp4_arg(format);
  if (!nv && (s_enc != 0 || s_enc_out)) {
    throw nb::value_error("s_enc/s_enc_out: MXFP4 has no tensor scale (pass 0 and None)");
  }
  const TensorView xv = to_view(x, "x"), pv = to_view(packed, "packed");
  const TensorView sv = to_view(scales, "scales"), ov = optional_view(s_enc_out, "s_enc_out");
  Status st;
  if (nv) {
    const Nvfp4ScaleRule r = scale_rule_arg(rule);
    nb::gil_scoped_release unlocked;
    st = quantize_packed_nvfp4_host(xv, r, static_cast<float>(s_enc), pv, sv, ov);
  } else {
    const MxScaleRule r = mx_rule_arg(rule);
    nb::gil_scoped_release unlocked;
    st = quantize_packed_mxfp4_host(xv, r, pv, sv);
  }
  throw_if_error(st);
}

void repack_to_operand_host_py(const Array& packed, const Array& scales, const std::string& format,
                               double s_enc, const std::string& recipe, const std::string& role,
                               const Array& data, const Array& scale) {
  require_host({{&packed, "packed"}, {&scales, "scales"}, {&data, "data"}, {&scale, "scale"}});
  const bool nv = packed_nvfp4_arg(format);
  const Recipe r = recipe_arg(recipe);
  const OperandRole ro = role_arg(role);
  const TensorView pv = to_view(packed, "packed"), sv = to_view(scales, "scales");
  const TensorView dv = to_view(data, "data", true), cv = to_view(scale, "scale");
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = repack_to_operand_host(pv, sv, nv, static_cast<float>(s_enc), r, ro, dv, cv);
  }
  throw_if_error(st);
}

std::vector<std::pair<std::string, std::string>> recipes() {
  std::vector<std::pair<std::string, std::string>> out;
  for (Recipe r : kAllRecipes) out.emplace_back(recipe_name(r), recipe_summary(r));
  return out;
}

}  // namespace

void bind_host(nb::module_& m) {
  using nb::arg;
  m.def("golden_forward", &golden_forward, arg("q"), arg("k"), arg("v"), arg("o"),
        arg("lse").none(), arg("recipe"), arg("softmax_scale"), arg("causal"),
        arg("smooth_k") = false,
        "CPU golden model forward (BSHD); writes o and lse (None to skip). smooth_k: subtract "
        "each (batch, kv head)'s key mean before quantizing K (lse corrected by scale * q . "
        "mean).");
  m.def("quantize_operand_host", &quantize_operand_host_py, arg("x"), arg("recipe"), arg("role"),
        arg("tensor_scale"), arg("smooth_k"), arg("data"), arg("scale"), arg("mean").none(),
        "Host reference of the kernel operand of one role (operands.h layouts).");
  m.def("attention_operands_host", &attention_operands_host, arg("q_data"), arg("q_scale"),
        arg("k_data"), arg("k_scale"), arg("v_data"), arg("v_scale"), arg("o"), arg("lse").none(),
        arg("recipe"), arg("softmax_scale"), arg("causal"),
        "Attention over kernel operands on the CPU, with the golden model's arithmetic.");
  m.def("quantize_packed_host", &quantize_packed_host_py, arg("x"), arg("format"), arg("rule"),
        arg("s_enc"), arg("packed"), arg("scales"), arg("s_enc_out").none(),
        "Packed FP4 (two E2M1 a byte, row-major block scales) of a BSHD tensor on the CPU: the "
        "bytes of the GPU quantizers. NVFP4 s_enc 0: from the tensor's amax.");
  m.def("repack_to_operand_host", &repack_to_operand_host_py, arg("packed"), arg("scales"),
        arg("format"), arg("s_enc"), arg("recipe"), arg("role"), arg("data"), arg("scale"),
        "Packed FP4 -> Q/K kernel operand on the CPU, the bit-exact fold of "
        "repack_to_operand_cuda (other combinations raise NotImplementedError).");
  m.def("recipes", &recipes, "(name, summary) of every recipe.");
}

}  // namespace fp4attn::py
