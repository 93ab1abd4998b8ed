// `fp4attn_bench bwd`: the GPU backward alone (attention_backward_operands_cuda on operands
// quantized once, O and LSE from one forward run), d = 128 causal on issue 8's grid: 16k tokens
// per batch (s in {4k, 8k, 16k}, b = 16384 / s), h = h_kv = 16. FLOPs = 2.5 x the forward's
// (5 GEMMs of 2 s^2 d / 2 each per head, causal halves), FlashAttention's convention.
//   fp4attn_bench bwd [--recipes nvfp4,fp8] [--quick] [--deterministic] [--json FILE]
//                     [--reps N] [--device N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "fp4attn/attention_bwd_cuda.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "json.h"
#include "suites.h"
#include "timing.h"

#ifndef FP4ATTN_BENCH_REVISION
#define FP4ATTN_BENCH_REVISION "unknown"
#endif

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
  // The main kernel: FP4ATTN_BWD_KERNEL=v1|v2 (bwd_launch.cu reads it; default v2), recorded.
  const char* env = std::getenv("FP4ATTN_BWD_KERNEL");
  const bool v1 = env != nullptr && (std::strcmp(env, "v1") == 0 || std::strcmp(env, "1") == 0);
  const char* kernel = v1 ? "v1" : "v2";
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
  std::printf("bwd %s %-9s b=%-2lld s=%-6lld h=%lld d=%lld %s%s  %.3f ms  %.1f TFLOP/s\n", kernel,
              recipe_name(c.recipe), (long long)b, (long long)s, (long long)h, (long long)d,
              c.causal ? "causal" : "full", deterministic ? " det" : "", t.median_ms, tflops);
  JsonObject j;
  j.str("case", "bwd").str("kernel", kernel).str("recipe", recipe_name(c.recipe));
  j.integer("b", b).integer("s_q", s).integer("s_k", s).integer("h", h).integer("h_kv", h);
  j.integer("d", d).boolean("causal", c.causal).boolean("deterministic", deterministic);
  j.str("grad_dtype", "bf16").num("flops", flops, 10).num("median_ms", t.median_ms);
  j.num("min_ms", t.min_ms).num("max_ms", t.max_ms).integer("samples", t.samples);
  j.num("tflops", tflops, 5);
  return j.render();
}

}  // namespace

int bwd_main(int argc, char** argv, const std::string& command) {
  std::vector<Recipe> recipes = {Recipe::kNvfp4};
  std::string out = "bwd.json";
  bool quick = false, deterministic = false;
  std::string revision = FP4ATTN_BENCH_REVISION;  // configure time: may predate the build
  TimingConfig tc;
  int device = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fp4attn_bench bwd: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--recipes") {
      recipes.clear();
      std::stringstream ss(value());
      std::string name;
      while (std::getline(ss, name, ',')) {
        Recipe r;
        if (!parse_recipe(name, &r)) {
          std::fprintf(stderr, "fp4attn_bench bwd: unknown recipe '%s'\n", name.c_str());
          return 2;
        }
        recipes.push_back(r);
      }
    } else if (a == "--json") {
      out = value();
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--deterministic") {
      deterministic = true;
    } else if (a == "--reps") {
      tc.reps = std::atoi(value().c_str());
    } else if (a == "--device") {
      device = std::atoi(value().c_str());
    } else if (a == "--revision") {
      revision = value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "fp4attn_bench bwd [--recipes nvfp4,fp8] [--quick] [--deterministic] [--json FILE] "
          "[--reps N] [--device N] [--revision SHA]\n  times the GPU backward alone, d=128 causal, 16k tokens, "
          "h=16, s in {4096, 8192, 16384} (--quick: 4096 only)\n");
      return 0;
    } else {
      std::fprintf(stderr, "fp4attn_bench bwd: unknown option '%s'\n", a.c_str());
      return 2;
    }
  }
  BENCH_CUDA(cudaSetDevice(device));
  const DeviceInfo dev = device_info(device);
  std::vector<std::string> rows;
  for (Recipe r : recipes) {
    for (int64_t s : {4096, 8192, 16384}) {
      if (quick && s != 4096) continue;
      rows.push_back(run_case({r, 16384 / s, s, 16, 128, true}, deterministic, tc));
    }
  }
  JsonObject top;
  top.str("suite", "bwd").str("revision", revision).str("command", command);
  top.str("utc", utc_now_iso()).str("device", dev.name);
  top.str("flops_convention", "2.5 x forward FLOPs (4 b h s_q s_k d, x0.5 causal)");
  top.raw("results", json_array_lines(rows));
  FILE* f = std::fopen(out.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "fp4attn_bench bwd: cannot write %s\n", out.c_str());
    return 1;
  }
  std::fputs(top.render_multiline().c_str(), f);
  std::fputs("\n", f);
  std::fclose(f);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace fp4attn::bench
