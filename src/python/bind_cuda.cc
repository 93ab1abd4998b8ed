// CUDA entry points (built when nvcc is): the GPU quantizers, the forward engine, the GPU
// backward and the paged KV cache. Every call takes the caller's stream as an integer (torch's
// current_stream().cuda_stream) and launches on it; nothing here synchronizes.
#include <cuda_runtime_api.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "fp4attn/attention_bwd_cuda.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/paged_attention_cuda.h"
#include "fp4attn/paged_kv_cuda.h"
#include "fp4attn/quantize_cuda.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/packed_host.h"
#include "python/status_error.h"

namespace fp4attn::py {
namespace {

cudaStream_t stream_arg(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

void quantize_operand_cuda_py(const Array& x, const std::string& recipe, const std::string& role,
                              double tensor_scale, bool smooth_k, const Array& data,
                              const Array& scale, const OptArray& mean, uintptr_t stream) {
  require_cuda({{&x, "x"}, {&data, "data"}, {&scale, "scale"}});
  if (mean) require_cuda({{&x, "x"}, {&*mean, "mean"}});
  OperandOptions opt;
  opt.tensor_scale = static_cast<float>(tensor_scale);
  opt.smooth_k = smooth_k;
  const Recipe r = recipe_arg(recipe);
  throw_if_error(quantize_operand_cuda(
      to_view(x, "x"), r, role_arg(role), opt, operand_data_view(data, "data", r, role_arg(role)),
      to_view(scale, "scale"), optional_view(mean, "mean"), stream_arg(stream)));
}

// Packed FP4 storage (quantize_cuda.h), row-major scales: the names and rules of the host
// bindings (bind_host.cc), so fp4attn picks one by the tensors' device.
void quantize_packed_cuda_py(const Array& x, const std::string& format, const std::string& rule,
                             double s_enc, const Array& packed, const Array& scales,
                             const OptArray& s_enc_out, uintptr_t stream) {
  require_cuda({{&x, "x"}, {&packed, "packed"}, {&scales, "scales"}});
  if (s_enc_out) require_cuda({{&x, "x"}, {&*s_enc_out, "s_enc_out"}});
  const bool nv = packed_nvfp4_arg(format);
  if (!nv && (s_enc != 0 || s_enc_out)) {
    throw nb::value_error("s_enc/s_enc_out: MXFP4 has no tensor scale (pass 0 and None)");
  }
  const TensorView xv = to_view(x, "x"), pv = to_view(packed, "packed");
  const TensorView sv = to_view(scales, "scales"), ov = optional_view(s_enc_out, "s_enc_out");
  throw_if_error(nv ? quantize_packed_nvfp4_cuda(xv, scale_rule_arg(rule),
                                                 static_cast<float>(s_enc), ScaleLayout::kRowMajor,
                                                 pv, sv, ov, stream_arg(stream))
                    : quantize_packed_mxfp4_cuda(xv, mx_rule_arg(rule), ScaleLayout::kRowMajor, pv,
                                                 sv, stream_arg(stream)));
}

// Only the bit-exact folds (check_exact_repack); the library's BF16 detour for the other
// combinations is not exposed, so a caller cannot get requantized operands by mistake.
void repack_to_operand_cuda_py(const Array& packed, const Array& scales, const std::string& format,
                               double s_enc, const std::string& recipe, const std::string& role,
                               const Array& data, const Array& scale, uintptr_t stream) {
  require_cuda({{&packed, "packed"}, {&scales, "scales"}, {&data, "data"}, {&scale, "scale"}});
  const bool nv = packed_nvfp4_arg(format);
  const Recipe r = recipe_arg(recipe);
  const OperandRole ro = role_arg(role);
  throw_if_error(check_exact_repack(nv, r, ro));
  PackedTensor in;
  in.format = nv ? PackedFormat::kNvfp4 : PackedFormat::kMxfp4;
  in.packed = to_view(packed, "packed");
  in.scales = to_view(scales, "scales");
  in.layout = ScaleLayout::kRowMajor;
  in.s_enc = static_cast<float>(s_enc);
  throw_if_error(repack_to_operand_cuda(in, r, ro, OperandOptions{}, to_view(data, "data", true),
                                        to_view(scale, "scale"), TensorView{}, stream_arg(stream)));
}

int32_t* flag_arg(const OptArray& flag) {
  return flag ? static_cast<int32_t*>(flag->data()) : nullptr;
}

// The GPU append of the paged KV cache (paged_kv_cuda.h): slot_mapping int32 or int64 read as
// is; error_flag (int32 [1], optional) gets the device error bits; scratch (>= 16 bytes,
// optional) is the calibration's, so that the call allocates nothing.
void paged_kv_append_cuda_py(const Array& k, const Array& v, const Array& slot_mapping,
                             const Array& k_data, const Array& v_data, const OptArray& k_scales,
                             const OptArray& v_scales, const Array& k_global, const Array& v_global,
                             const std::string& format, const std::string& rule,
                             const OptArray& error_flag, const OptArray& scratch, bool calibrate,
                             uintptr_t stream) {
  require_cuda({{&k, "k"},
                {&v, "v"},
                {&slot_mapping, "slot_mapping"},
                {&k_data, "k_data"},
                {&v_data, "v_data"},
                {&k_global, "k_global"},
                {&v_global, "v_global"}});
  if (k_scales) require_cuda({{&k, "k"}, {&*k_scales, "k_scales"}});
  if (v_scales) require_cuda({{&k, "k"}, {&*v_scales, "v_scales"}});
  if (error_flag) require_cuda({{&k, "k"}, {&*error_flag, "error_flag"}});
  if (scratch) require_cuda({{&k, "k"}, {&*scratch, "scratch"}});
  if (scratch && scratch->nbytes() < kPagedAppendScratchBytes) {
    throw nb::value_error("scratch: expected at least 16 bytes");
  }
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, rule);
  PagedAppendCudaOptions opt;
  opt.error_flag = flag_arg(error_flag);
  opt.scratch = scratch ? scratch->data() : nullptr;
  opt.calibrate = calibrate;
  throw_if_error(paged_kv_append_cuda(to_view(k, "k"), to_view(v, "v"),
                                      to_view(slot_mapping, "slot_mapping"), cache, opt,
                                      stream_arg(stream)));
}

// The GPU decode (paged_attention_cuda.h) with no host copies: the indices are read on the
// device only (bad ones give NaN rows and error_flag bits). workspace (optional): zeroed once
// by its owner and then used by this function only, one call in flight (workspace_is_clean);
// num_splits as PagedAttentionCudaOptions::num_splits.
void paged_attention_cuda_py(const Array& q, const OptArray& cu_seqlens_q, const Array& k_data,
                             const Array& v_data, const OptArray& k_scales,
                             const OptArray& v_scales, const Array& k_global, const Array& v_global,
                             const std::string& format, const Array& block_tables,
                             const Array& seq_lens, double softmax_scale, bool causal,
                             const Array& o, const OptArray& lse, const OptArray& workspace,
                             int num_splits, const OptArray& error_flag, uintptr_t stream) {
  require_cuda({{&q, "q"},
                {&k_data, "k_data"},
                {&v_data, "v_data"},
                {&k_global, "k_global"},
                {&v_global, "v_global"},
                {&block_tables, "block_tables"},
                {&seq_lens, "seq_lens"},
                {&o, "o"}});
  if (cu_seqlens_q) require_cuda({{&q, "q"}, {&*cu_seqlens_q, "cu_seqlens_q"}});
  if (k_scales) require_cuda({{&q, "q"}, {&*k_scales, "k_scales"}});
  if (v_scales) require_cuda({{&q, "q"}, {&*v_scales, "v_scales"}});
  if (lse) require_cuda({{&q, "q"}, {&*lse, "lse"}});
  if (workspace) require_cuda({{&q, "q"}, {&*workspace, "workspace"}});
  if (error_flag) require_cuda({{&q, "q"}, {&*error_flag, "error_flag"}});
  const PagedKvCache cache =
      paged_cache_arg(k_data, v_data, k_scales, v_scales, k_global, v_global, format, "nearest");
  PagedAttentionOptions opt;
  opt.softmax_scale = softmax_scale;
  opt.causal = causal;
  PagedAttentionCudaOptions copt;
  copt.num_splits = num_splits;
  copt.error_flag = flag_arg(error_flag);
  if (workspace) {
    copt.workspace = workspace->data();
    copt.workspace_bytes = workspace->nbytes();
    copt.workspace_is_clean = true;
  }
  throw_if_error(paged_attention_cuda(to_view(q, "q"), optional_view(cu_seqlens_q, "cu_seqlens_q"),
                                      cache, to_view(block_tables, "block_tables"),
                                      to_view(seq_lens, "seq_lens"), opt, to_view(o, "o"),
                                      optional_view(lse, "lse"), copt, stream_arg(stream)));
}

ForwardOptions forward_options(const std::string& recipe, double softmax_scale, bool causal) {
  ForwardOptions opt;
  opt.recipe = recipe_arg(recipe);
  opt.softmax_scale = static_cast<float>(softmax_scale);
  opt.causal = causal;
  return opt;
}

void attention_cuda(const Array& q, const Array& k, const Array& v, const Array& o,
                    const OptArray& lse, const std::string& recipe, double softmax_scale,
                    bool causal, uintptr_t stream, const OptArray& row_max) {
  require_cuda({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}});
  if (lse) require_cuda({{&q, "q"}, {&*lse, "lse"}});
  if (row_max) require_cuda({{&q, "q"}, {&*row_max, "row_max"}});
  throw_if_error(attention_forward_cuda(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"),
                                        forward_options(recipe, softmax_scale, causal),
                                        to_view(o, "o"), optional_view(lse, "lse"),
                                        stream_arg(stream), optional_view(row_max, "row_max")));
}

void attention_operands_cuda(const Array& q_data, const Array& q_scale, const Array& k_data,
                             const Array& k_scale, const Array& v_data, const Array& v_scale,
                             const Array& o, const OptArray& lse, const std::string& recipe,
                             double softmax_scale, bool causal, uintptr_t stream,
                             const OptArray& row_max) {
  require_cuda({{&q_data, "q_data"},
                {&q_scale, "q_scale"},
                {&k_data, "k_data"},
                {&k_scale, "k_scale"},
                {&v_data, "v_data"},
                {&v_scale, "v_scale"},
                {&o, "o"}});
  if (lse) require_cuda({{&o, "o"}, {&*lse, "lse"}});
  if (row_max) require_cuda({{&o, "o"}, {&*row_max, "row_max"}});
  const ForwardOptions opt = forward_options(recipe, softmax_scale, causal);
  const ForwardOperands in =
      operand_views(q_data, q_scale, k_data, k_scale, v_data, v_scale, opt.recipe);
  throw_if_error(attention_forward_operands_cuda(in, opt, to_view(o, "o"),
                                                 optional_view(lse, "lse"), stream_arg(stream),
                                                 optional_view(row_max, "row_max")));
}

void attention_backward_cuda_py(const Array& q, const Array& k, const Array& v, const Array& o,
                                const Array& lse, const Array& dout, const Array& dq,
                                const Array& dk, const Array& dv, const std::string& recipe,
                                double softmax_scale, bool causal, bool deterministic,
                                const std::string& d_source, uintptr_t stream,
                                const OptArray& row_max) {
  require_cuda({{&q, "q"},
                {&k, "k"},
                {&v, "v"},
                {&o, "o"},
                {&lse, "lse"},
                {&dout, "dout"},
                {&dq, "dq"},
                {&dk, "dk"},
                {&dv, "dv"}});
  if (row_max) require_cuda({{&q, "q"}, {&*row_max, "row_max"}});
  BackwardCudaOptions bopt;
  bopt.deterministic = deterministic;
  bopt.d_source = d_source_arg(d_source);
  throw_if_error(attention_backward_cuda(
      to_view(q, "q"), to_view(k, "k"), to_view(v, "v"),
      forward_options(recipe, softmax_scale, causal), to_view(o, "o"), to_view(lse, "lse"),
      to_view(dout, "dout"), to_view(dq, "dq"), to_view(dk, "dk"), to_view(dv, "dv"), bopt,
      stream_arg(stream), optional_view(row_max, "row_max")));
}

// The backward on the kernel operands the forward ran on (attention_operands_cuda's): no
// requantization of Q/K/V, so the gradients see exactly the forward's operands.
void attention_backward_operands_cuda_py(
    const Array& q_data, const Array& q_scale, const Array& k_data, const Array& k_scale,
    const Array& v_data, const Array& v_scale, const Array& o, const Array& lse, const Array& dout,
    const Array& dq, const Array& dk, const Array& dv, const std::string& recipe,
    double softmax_scale, bool causal, bool deterministic, const std::string& d_source,
    uintptr_t stream, const OptArray& row_max) {
  require_cuda({{&q_data, "q_data"},
                {&q_scale, "q_scale"},
                {&k_data, "k_data"},
                {&k_scale, "k_scale"},
                {&v_data, "v_data"},
                {&v_scale, "v_scale"},
                {&o, "o"},
                {&lse, "lse"},
                {&dout, "dout"},
                {&dq, "dq"},
                {&dk, "dk"},
                {&dv, "dv"}});
  if (row_max) require_cuda({{&o, "o"}, {&*row_max, "row_max"}});
  const ForwardOptions opt = forward_options(recipe, softmax_scale, causal);
  const ForwardOperands in =
      operand_views(q_data, q_scale, k_data, k_scale, v_data, v_scale, opt.recipe);
  BackwardCudaOptions bopt;
  bopt.deterministic = deterministic;
  bopt.d_source = d_source_arg(d_source);
  throw_if_error(attention_backward_operands_cuda(
      in, opt, to_view(o, "o"), to_view(lse, "lse"), to_view(dout, "dout"), to_view(dq, "dq"),
      to_view(dk, "dk"), to_view(dv, "dv"), bopt, stream_arg(stream),
      optional_view(row_max, "row_max")));
}

}  // namespace

void bind_cuda(nb::module_& m) {
  using nb::arg;
  m.def("has_cuda", [] { return true; });
  m.def("quantize_operand_cuda", &quantize_operand_cuda_py, arg("x"), arg("recipe"), arg("role"),
        arg("tensor_scale"), arg("smooth_k"), arg("data"), arg("scale"), arg("mean").none(),
        arg("stream"), "GPU kernel operand of one role, launched on `stream`.");
  m.def("quantize_packed_cuda", &quantize_packed_cuda_py, arg("x"), arg("format"), arg("rule"),
        arg("s_enc"), arg("packed"), arg("scales"), arg("s_enc_out").none(), arg("stream"),
        "GPU packed FP4 of a BSHD tensor (row-major scales), launched on `stream`.");
  m.def("repack_to_operand_cuda", &repack_to_operand_cuda_py, arg("packed"), arg("scales"),
        arg("format"), arg("s_enc"), arg("recipe"), arg("role"), arg("data"), arg("scale"),
        arg("stream"), "GPU bit-exact fold of packed FP4 into a Q/K kernel operand, on `stream`.");
  m.def("paged_kv_append_cuda", &paged_kv_append_cuda_py, arg("k"), arg("v"), arg("slot_mapping"),
        arg("k_data"), arg("v_data"), arg("k_scales").none(), arg("v_scales").none(),
        arg("k_global"), arg("v_global"), arg("format"), arg("rule"), arg("error_flag").none(),
        arg("scratch").none(), arg("calibrate"), arg("stream"),
        "GPU append of the paged KV cache (the host append's bytes), launched on `stream`.");
  m.def("paged_attention_cuda", &paged_attention_cuda_py, arg("q"), arg("cu_seqlens_q").none(),
        arg("k_data"), arg("v_data"), arg("k_scales").none(), arg("v_scales").none(),
        arg("k_global"), arg("v_global"), arg("format"), arg("block_tables"), arg("seq_lens"),
        arg("softmax_scale"), arg("causal"), arg("o"), arg("lse").none(), arg("workspace").none(),
        arg("num_splits"), arg("error_flag").none(), arg("stream"),
        "GPU decode over the paged cache (paged_attention_cuda), on `stream`; no host copy.");
  m.def(
      "paged_decode_schedule",
      [](int64_t b, int64_t total_q, int64_t h, int64_t kv_heads, int64_t head_dim, bool nvfp4,
         int64_t max_s_q, int64_t max_len, int forced) {
        const PagedDecodeSchedule s = paged_decode_schedule(b, total_q, h, kv_heads, head_dim,
                                                            nvfp4, max_s_q, max_len, forced);
        return nb::make_tuple(s.num_splits, s.split_size, s.workspace_bytes);
      },
      arg("b"), arg("total_q"), arg("h"), arg("kv_heads"), arg("head_dim"), arg("nvfp4"),
      arg("max_s_q"), arg("max_len"), arg("forced"),
      "(num_splits, split_size, workspace_bytes) paged_attention_cuda uses for these shapes.");
  m.def("attention_cuda", &attention_cuda, arg("q"), arg("k"), arg("v"), arg("o"),
        arg("lse").none(), arg("recipe"), arg("softmax_scale"), arg("causal"), arg("stream"),
        arg("row_max").none() = nb::none(),
        "GPU forward attention on BF16/FP16 BSHD q/k/v, launched on `stream`; row_max (FP32 "
        "[b, h, s_q], optional): each row's integer log2 reference, which the backward of "
        "nvfp4-fast and fp4-direct needs.");
  m.def("attention_operands_cuda", &attention_operands_cuda, arg("q_data"), arg("q_scale"),
        arg("k_data"), arg("k_scale"), arg("v_data"), arg("v_scale"), arg("o"), arg("lse").none(),
        arg("recipe"), arg("softmax_scale"), arg("causal"), arg("stream"),
        arg("row_max").none() = nb::none(),
        "GPU forward attention over kernel operands, launched on `stream` (row_max as "
        "attention_cuda's).");
  m.def("attention_backward_cuda", &attention_backward_cuda_py, arg("q"), arg("k"), arg("v"),
        arg("o"), arg("lse"), arg("dout"), arg("dq"), arg("dk"), arg("dv"), arg("recipe"),
        arg("softmax_scale"), arg("causal"), arg("deterministic"), arg("d_source"), arg("stream"),
        arg("row_max").none() = nb::none(),
        "GPU backward of attention_cuda, launched on `stream`. d_source: 'forward-o' or "
        "'high-precision-o' (docs/numerics.md §8). row_max: the forward's, "
        "required for nvfp4-fast and fp4-direct.");
  m.def("attention_backward_operands_cuda", &attention_backward_operands_cuda_py, arg("q_data"),
        arg("q_scale"), arg("k_data"), arg("k_scale"), arg("v_data"), arg("v_scale"), arg("o"),
        arg("lse"), arg("dout"), arg("dq"), arg("dk"), arg("dv"), arg("recipe"),
        arg("softmax_scale"), arg("causal"), arg("deterministic"), arg("d_source"), arg("stream"),
        arg("row_max").none() = nb::none(),
        "GPU backward of attention_operands_cuda on the same kernel operands (row_max: the "
        "forward's, required for nvfp4-fast and fp4-direct; no "
        "requantization of Q/K/V), launched on `stream`. dq [b, s_q, h, d], dk/dv "
        "[b, s_k, h_kv, d]: F32 or BF16.");
  m.def(
      "check_forward_device", [] { throw_if_error(check_forward_device()); },
      "Raises ValueError saying why the current device cannot run the engine.");
}

}  // namespace fp4attn::py
