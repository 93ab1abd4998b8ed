// The golden model's backward (float64 gradients of a recipe's forward, docs/numerics.md §8): the
// CPU path of autograd in the Python package.
#include <nanobind/stl/string.h>

#include <string>

#include "fp4attn/golden_backward.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/status_error.h"

namespace fp4attn::py {
namespace {

void golden_backward(const Array& q, const Array& k, const Array& v, const Array& o,
                     const Array& dout, const Array& lse, const Array& dq, const Array& dk,
                     const Array& dv, const std::string& recipe, double softmax_scale, bool causal,
                     const std::string& d_source) {
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
        arg("causal"), arg("d_source") = "forward-o",
        "CPU golden model backward (BSHD): writes dq, dk, dv (f64/f32) for the upstream gradient "
        "dout, from the forward's inputs, o and lse. d_source: 'forward-o' or "
        "'high-precision-o' (docs/numerics.md §8).");
}

}  // namespace fp4attn::py
