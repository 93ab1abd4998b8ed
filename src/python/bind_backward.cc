// The golden model's backward (float64 gradients of a recipe's forward, docs/numerics.md §8): the
// CPU path of autograd in the Python package.
#include <nanobind/stl/string.h>

#include <cmath>
#include <string>

#include "fp4attn/golden/golden_backward.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/status_error.h"

namespace fp4attn::py {
namespace {

// A static NVFP4 encode scale as RecipeOptions takes it: 0 (computed) or finite and > 0.
float tensor_scale_arg(double s, const char* name) {
  if (!(std::isfinite(s) && s >= 0)) {
    throw nb::value_error((std::string(name) +
                           ": expected a finite value >= 0 (0 = computed from the data), got " +
                           std::to_string(s))
                              .c_str());
  }
  return static_cast<float>(s);
}

void golden_backward(const Array& q, const Array& k, const Array& v, const Array& o,
                     const Array& dout, const Array& lse, const Array& dq, const Array& dk,
                     const Array& dv, const std::string& recipe, double softmax_scale, bool causal,
                     const std::string& d_source, double q_tensor_scale, double k_tensor_scale,
                     double v_tensor_scale, bool smooth_k) {
  require_host({{&q, "q"},
                {&k, "k"},
                {&v, "v"},
                {&o, "o"},
                {&dout, "dout"},
                {&lse, "lse"},
                {&dq, "dq"},
                {&dk, "dk"},
                {&dv, "dv"}});
  RecipeOptions opt;
  opt.recipe = recipe_arg(recipe);
  opt.softmax_scale = softmax_scale;
  opt.causal = causal;
  opt.smooth_k = smooth_k;
  opt.q_tensor_scale = tensor_scale_arg(q_tensor_scale, "q_tensor_scale");
  opt.k_tensor_scale = tensor_scale_arg(k_tensor_scale, "k_tensor_scale");
  opt.v_tensor_scale = tensor_scale_arg(v_tensor_scale, "v_tensor_scale");
  BackwardOptions bopt;
  bopt.d_source = d_source_arg(d_source);
  const TensorView qv = to_view(q, "q"), kv = to_view(k, "k"), vv = to_view(v, "v");
  const TensorView ov = to_view(o, "o"), dov = to_view(dout, "dout"), lv = to_view(lse, "lse");
  const TensorView dqv = to_view(dq, "dq"), dkv = to_view(dk, "dk"), dvv = to_view(dv, "dv");
  Status st;
  {
    nb::gil_scoped_release unlocked;  // the forward's cost again, several times over
    st = golden_attention_backward(qv, kv, vv, ov, dov, lv, opt, dqv, dkv, dvv, bopt);
  }
  throw_if_error(st);
}

}  // namespace

void bind_backward(nb::module_& m) {
  using nb::arg;
  m.def("golden_backward", &golden_backward, arg("q"), arg("k"), arg("v"), arg("o"), arg("dout"),
        arg("lse"), arg("dq"), arg("dk"), arg("dv"), arg("recipe"), arg("softmax_scale"),
        arg("causal"), arg("d_source") = "forward-o", arg("q_tensor_scale") = 0.0,
        arg("k_tensor_scale") = 0.0, arg("v_tensor_scale") = 0.0, arg("smooth_k") = false,
        "CPU golden model backward (BSHD): writes dq, dk, dv (f64/f32) for the upstream gradient "
        "dout, from the forward's inputs, o and lse. d_source: 'forward-o' or "
        "'high-precision-o' (docs/numerics.md §8). *_tensor_scale: the static NVFP4 encode "
        "scales the forward's operands were made with (0: computed); smooth_k: the forward "
        "smoothed K (its lse then carries the scale * q . mean term).");
}

}  // namespace fp4attn::py
