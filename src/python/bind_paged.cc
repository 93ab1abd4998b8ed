// Host (CPU) entry points of the paged KV cache (issue 9, paged_kv.h): the append through a slot
// mapping, the decoded cache, and the golden paged attention. The cache travels as its tensors
// plus a format and a rule name (paged_cache_arg); fp4attn/paged.py builds them.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "fp4attn/golden/paged_kv.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/status_error.h"
#include "validate/validate_paged.h"

namespace fp4attn::py {
namespace {

void require_host_cache(const Array& k_data, const Array& v_data, const OptArray& k_scales,
                        const OptArray& v_scales, const Array& k_global, const Array& v_global) {
  require_host(
      {{&k_data, "k_data"}, {&v_data, "v_data"}, {&k_global, "k_global"}, {&v_global, "v_global"}});
  if (k_scales) require_host({{&*k_scales, "k_scales"}});
  if (v_scales) require_host({{&*v_scales, "v_scales"}});
}

void paged_kv_append_host(const Array& k, const Array& v, const Array& slot_mapping,
                          const Array& k_data, const Array& v_data, const OptArray& k_scales,
                          const OptArray& v_scales, const Array& k_global, const Array& v_global,
                          const std::string& format, const std::string& rule) {
  require_host({{&k, "k"}, {&v, "v"}, {&slot_mapping, "slot_mapping"}});
  require_host_cache(k_data, v_data, k_scales, v_scales, k_global, v_global);
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, rule);
  const TensorView kv = to_view(k, "k"), vv = to_view(v, "v");
  const TensorView sv = to_view(slot_mapping, "slot_mapping");
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = paged_kv_append(kv, vv, sv, cache);
  }
  throw_if_error(st);
}

void paged_kv_dequantize_host(const Array& k_data, const Array& v_data, const OptArray& k_scales,
                              const OptArray& v_scales, const Array& k_global,
                              const Array& v_global, const std::string& format,
                              const Array& block_tables, const Array& seq_lens, const Array& k_out,
                              const Array& v_out) {
  require_host_cache(k_data, v_data, k_scales, v_scales, k_global, v_global);
  require_host({{&block_tables, "block_tables"},
                {&seq_lens, "seq_lens"},
                {&k_out, "k_out"},
                {&v_out, "v_out"}});
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, "nearest");
  const TensorView bt = to_view(block_tables, "block_tables");
  const TensorView sl = to_view(seq_lens, "seq_lens");
  const TensorView ko = to_view(k_out, "k_out"), vo = to_view(v_out, "v_out");
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = paged_kv_dequantize(cache, bt, sl, ko, vo);
  }
  throw_if_error(st);
}

void golden_paged_attention_host(const Array& q, const OptArray& cu_seqlens_q, const Array& k_data,
                                 const Array& v_data, const OptArray& k_scales,
                                 const OptArray& v_scales, const Array& k_global,
                                 const Array& v_global, const std::string& format,
                                 const Array& block_tables, const Array& seq_lens,
                                 double softmax_scale, bool causal, const Array& o,
                                 const OptArray& lse) {
  require_host({{&q, "q"}, {&block_tables, "block_tables"}, {&seq_lens, "seq_lens"}, {&o, "o"}});
  if (cu_seqlens_q) require_host({{&*cu_seqlens_q, "cu_seqlens_q"}});
  if (lse) require_host({{&*lse, "lse"}});
  require_host_cache(k_data, v_data, k_scales, v_scales, k_global, v_global);
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, "nearest");
  PagedAttentionOptions opt;
  opt.softmax_scale = softmax_scale;
  opt.causal = causal;
  const TensorView qv = to_view(q, "q"), cu = optional_view(cu_seqlens_q, "cu_seqlens_q");
  const TensorView bt = to_view(block_tables, "block_tables");
  const TensorView sl = to_view(seq_lens, "seq_lens");
  const TensorView ov = to_view(o, "o"), lv = optional_view(lse, "lse");
  Status st;
  {
    nb::gil_scoped_release unlocked;  // float64 over every cached token
    st = golden_paged_attention(qv, cu, cache, bt, sl, opt, ov, lv);
  }
  throw_if_error(st);
}

// The host value checks of the attention indices (validate_paged_indices): block_tables,
// seq_lens and cu_seqlens_q in host memory; q and the cache on any device (only their shapes
// are read).
void paged_check_indices_host(const Array& q, const OptArray& cu_seqlens_q, const Array& k_data,
                              const Array& v_data, const OptArray& k_scales,
                              const OptArray& v_scales, const Array& k_global,
                              const Array& v_global, const std::string& format,
                              const Array& block_tables, const Array& seq_lens) {
  require_host({{&block_tables, "block_tables"}, {&seq_lens, "seq_lens"}});
  if (cu_seqlens_q) require_host({{&*cu_seqlens_q, "cu_seqlens_q"}});
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, "nearest");
  PagedKvShape kv;
  throw_if_error(validate_paged_kv_cache(cache, {}, /*writable=*/false, &kv));
  PagedQueryShape qs;
  const TensorView cu = optional_view(cu_seqlens_q, "cu_seqlens_q");
  const TensorView bt = to_view(block_tables, "block_tables");
  const TensorView sl = to_view(seq_lens, "seq_lens");
  throw_if_error(validate_paged_attention(to_view(q, "q"), cu, bt, sl, {}, {}, kv, &qs));
  throw_if_error(validate_paged_indices(cu, bt, sl, kv, qs));
}

}  // namespace

void bind_paged(nb::module_& m) {
  using nb::arg;
  m.def("paged_kv_append_host", &paged_kv_append_host, arg("k"), arg("v"), arg("slot_mapping"),
        arg("k_data"), arg("v_data"), arg("k_scales").none(), arg("v_scales").none(),
        arg("k_global"), arg("v_global"), arg("format"), arg("rule"),
        "Writes k/v [num_tokens, kv_heads, head_dim] into their cache slots (paged_kv_append); "
        "an uncalibrated global (0) is set by this append when it writes nonzero finite data.");
  m.def("paged_kv_dequantize_host", &paged_kv_dequantize_host, arg("k_data"), arg("v_data"),
        arg("k_scales").none(), arg("v_scales").none(), arg("k_global"), arg("v_global"),
        arg("format"), arg("block_tables"), arg("seq_lens"), arg("k_out"), arg("v_out"),
        "The cached tokens of every sequence, decoded into k_out/v_out [b, max_len, kv_heads, d].");
  m.def("golden_paged_attention_host", &golden_paged_attention_host, arg("q"),
        arg("cu_seqlens_q").none(), arg("k_data"), arg("v_data"), arg("k_scales").none(),
        arg("v_scales").none(), arg("k_global"), arg("v_global"), arg("format"),
        arg("block_tables"), arg("seq_lens"), arg("softmax_scale"), arg("causal"), arg("o"),
        arg("lse").none(), "The golden paged attention (float64 on the decoded cache).");
  m.def("paged_check_indices_host", &paged_check_indices_host, arg("q"), arg("cu_seqlens_q").none(),
        arg("k_data"), arg("v_data"), arg("k_scales").none(), arg("v_scales").none(),
        arg("k_global"), arg("v_global"), arg("format"), arg("block_tables"), arg("seq_lens"),
        "Raises ValueError naming the first bad page id, length or cu_seqlens_q entry (host "
        "copies of the indices; q and the cache only give shapes).");
}

}  // namespace fp4attn::py
