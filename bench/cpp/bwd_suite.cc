// `fp4attn_bench bwd`: the GPU backward alone (attention_backward_operands_cuda on operands
// quantized once, O and LSE from one forward run), d = 128 causal on issue 8's grid: 16k tokens
// per batch (s in {4k, 8k, 16k}, b = 16384 / s), h = h_kv = 16. FLOPs = 2.5 x the forward's
// (5 GEMMs of 2 s^2 d / 2 each per head, causal halves), FlashAttention's convention.
//   fp4attn_bench bwd [--recipes nvfp4,fp8] [--quick] [--deterministic] [--out FILE] [--reps N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fp4attn/attention_bwd_cuda.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "record.h"
#include "suite_args.h"
#include "suites.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

void check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "fp4attn_bench bwd: %s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

struct Case {
  Recipe recipe;
  int64_t b, s, h, d;
  bool causal;
};

std::string run_case(const Case& c, bool deterministic, const TimingConfig& tc) {
  const int64_t b = c.b, s = c.s, h = c.h, d = c.d;
  const int64_t n = b * s * h * d;
  DeviceBuffer q(2 * n), k(2 * n), v(2 * n), o(2 * n), dout(2 * n), lse(4 * b * h * s),
      row_max(4 * b * h * s);
  DeviceBuffer dq(4 * n), dk(4 * n), dv(4 * n);
  cudaStream_t stream = nullptr;
  fill_random_bf16(q.get(), n, 1, stream);
  fill_random_bf16(k.get(), n, 2, stream);
  fill_random_bf16(v.get(), n, 3, stream);
  fill_random_bf16(dout.get(), n, 4, stream);
  ForwardOptions opt;
  opt.recipe = c.recipe;
  opt.causal = c.causal;
  const TensorView tq = make_view(q.get(), DType::kBF16, {b, s, h, d});
  const TensorView tk = make_view(k.get(), DType::kBF16, {b, s, h, d});
  const TensorView tv = make_view(v.get(), DType::kBF16, {b, s, h, d});
  const TensorView to = make_view(o.get(), DType::kBF16, {b, s, h, d});
  const TensorView tl = make_view(lse.get(), DType::kF32, {b, h, s});
  const TensorView tm = make_view(row_max.get(), DType::kF32, {b, h, s});  // nvfp4-fast reads it
  const TensorView tdo = make_view(dout.get(), DType::kBF16, {b, s, h, d});
  check(attention_forward_cuda(tq, tk, tv, opt, to, tl, stream, tm), "forward");
  const int64_t tiles = operand_scale_tiles(s), pitch = operand_v_pitch(s);
  DeviceBuffer qd(n), kd(n), vd(b * h * d * pitch), qs(4 * b * h * tiles), ks(4 * b * h * tiles),
      vs(4 * b * h * d);
  ForwardOperands in;
  in.q_data = make_view(qd.get(), DType::kE4M3, {b, h, s, d});
  in.k_data = make_view(kd.get(), DType::kE4M3, {b, h, s, d});
  in.v_data = make_view(vd.get(), DType::kE4M3, {b, h, d, pitch});
  in.q_scale = make_view(qs.get(), DType::kF32, {b, h, tiles});
  in.k_scale = make_view(ks.get(), DType::kF32, {b, h, tiles});
  in.v_scale = make_view(vs.get(), DType::kF32, {b, h, d});
  check(quantize_operand_cuda(tq, c.recipe, OperandRole::kQ, {}, in.q_data, in.q_scale, {}, stream),
        "quantize q");
  check(quantize_operand_cuda(tk, c.recipe, OperandRole::kK, {}, in.k_data, in.k_scale, {}, stream),
        "quantize k");
  check(quantize_operand_cuda(tv, c.recipe, OperandRole::kV, {}, in.v_data, in.v_scale, {}, stream),
        "quantize v");
  const TensorView tdq = make_view(dq.get(), DType::kBF16, {b, s, h, d});
  const TensorView tdk = make_view(dk.get(), DType::kBF16, {b, s, h, d});
  const TensorView tdv = make_view(dv.get(), DType::kBF16, {b, s, h, d});
  BackwardCudaOptions bopt;
  bopt.deterministic = deterministic;
  const Timing t = time_launches(
      [&](int) {
        check(
            attention_backward_operands_cuda(in, opt, to, tl, tdo, tdq, tdk, tdv, bopt, stream, tm),
            "backward");
      },
      1, tc, stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  const double fwd_flops = 4.0 * b * h * double(s) * double(s) * d * (c.causal ? 0.5 : 1.0);
  const double flops = 2.5 * fwd_flops;
  const double tflops = flops / (t.median_ms * 1e-3) / 1e12;
  std::printf("bwd %-10s b=%-2lld s=%-6lld h=%lld d=%lld %s%s  %.3f ms  %.1f TFLOP/s\n",
              recipe_name(c.recipe), (long long)b, (long long)s, (long long)h, (long long)d,
              c.causal ? "causal" : "full", deterministic ? " det" : "", t.median_ms, tflops);
  JsonObject j;
  j.str("case", "bwd").str("recipe", recipe_name(c.recipe));
  j.integer("b", b).integer("s_q", s).integer("s_k", s).integer("h", h).integer("h_kv", h);
  j.integer("d", d).boolean("causal", c.causal).boolean("deterministic", deterministic);
  j.str("grad_dtype", "bf16").num("flops", flops, 10).num("median_ms", t.median_ms);
  j.num("min_ms", t.min_ms).num("max_ms", t.max_ms).integer("samples", t.samples);
  j.num("tflops", tflops, 5);
  return j.render();
}

}  // namespace

int bwd_main(const std::vector<std::string>& argv, const std::string& command) {
  const std::vector<FlagSpec> flags = suite_flags(
      {
          {"recipes", true, "recipes to time", "nvfp4"},
          {"quick", false, "s = 4096 only", ""},
          {"deterministic", false, "the deterministic backward", ""},
          {"warmup", true, "warm-up samples", "3"},
          {"reps", true, "timed samples, median reported", "20"},
      },
      "bwd.json");
  const Args a(argv, flags);
  if (print_help(a,
                 "usage: fp4attn_bench bwd [flags]\n\nTimes the GPU backward alone, d=128 "
                 "causal, 16k tokens, h=16, s in {4096, 8192, 16384}.",
                 flags)) {
    return 0;
  }
  SuiteOptions opt;
  read_suite_flags(a, "bwd.json", command, &opt);
  const std::vector<Recipe> recipes = recipe_list(a, "nvfp4");
  const bool quick = a.has("quick"), deterministic = a.has("deterministic");
  opt.timing.warmup = static_cast<int>(a.get_int("warmup", 3, 0, 1000));
  opt.timing.reps = static_cast<int>(a.get_int("reps", 20, 1, 100000));

  BENCH_CUDA(cudaSetDevice(opt.device));
  const DeviceInfo dev = device_info(opt.device);
  const std::string date = utc_now_iso();
  std::vector<std::string> rows;
  for (Recipe r : recipes) {
    for (int64_t s : {4096, 8192, 16384}) {
      if (quick && s != 4096) continue;
      rows.push_back(run_case({r, 16384 / s, s, 16, 128, true}, deterministic, opt.timing));
    }
  }
  JsonObject doc = record_header("bwd", false, opt, dev.name, date);
  doc.str("flops_convention", "2.5 x forward FLOPs (4 b h s_q s_k d, x0.5 causal)");
  doc.raw("records", json_array_lines(rows));
  if (!write_record(opt, doc)) return 1;
  std::printf("wrote %s\n", opt.out_path.c_str());
  return 0;
}

}  // namespace fp4attn::bench
