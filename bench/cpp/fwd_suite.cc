// The fwd suite: for every grid point, seeded N(0, 1) BF16 q/k/v, the three operand quantizations
// (timed, reported apart as quant_ms), the forward engine timed with CUDA events (median of at
// least min_reps calls and min_time_ms), the SM clock it ran at, and cos / rel-L2 against float64
// on a sample of rows; then the FA3-shape accuracy record. The JSON is rewritten after every
// point so that a run stopped early still leaves what it measured (complete: false).
#include "fwd_suite.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "copy.h"
#include "fwd_accuracy.h"
#include "fwd_device.h"
#include "fwd_engine.h"
#include "fwd_grid.h"
#include "fwd_report.h"
#include "harness/metrics.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

// A CUDA error that a kernel left behind (sticky errors end the run; the JSON keeps the rest).
std::string pending_cuda_error(cudaStream_t stream, bool* fatal) {
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (launched == cudaSuccess && synced == cudaSuccess) return "";
  *fatal = synced != cudaSuccess;
  return cudaGetErrorString(launched != cudaSuccess ? launched : synced);
}

CopyCeiling measure_copy(const DeviceInfo& dev, const TimingConfig& timing, cudaStream_t stream) {
  // 1 GiB each way: far beyond the L2, one slot.
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer src(bytes), dst(bytes);
  fill_random_bf16(src.get(), bytes / 2, 7, stream);
  const Timing tm = time_launches(
      [&](int) {
        BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
      },
      1, timing, stream);
  const Timing tk =
      time_launches([&](int) { launch_copy_kernel(dst.get(), src.get(), bytes, dev.sms, stream); },
                    1, timing, stream);
  CopyCeiling c;
  c.bytes = static_cast<int64_t>(bytes);
  c.memcpy_tbps = 2.0 * bytes / tm.median_ms / 1e9;
  c.kernel_tbps = 2.0 * bytes / tk.median_ms / 1e9;
  c.tbps = std::max(c.memcpy_tbps, c.kernel_tbps);
  return c;
}

// Median, min and max of at least opt.min_reps calls and opt.min_time_ms in all (capped at
// max_reps), after the warm-up; the number of calls comes from a short first estimate.
Timing time_adaptive(const std::function<void(int)>& call, const FwdOptions& opt,
                     cudaStream_t stream) {
  const Timing est = time_launches(call, 1, {opt.timing.warmup, 3}, stream);
  int reps = opt.min_reps;
  if (est.median_ms > 0) {
    reps = std::max(reps, static_cast<int>(std::ceil(opt.min_time_ms / est.median_ms)));
  }
  reps = std::clamp(reps, 1, std::max(opt.max_reps, opt.min_reps));
  return time_launches(call, 1, {1, reps}, stream);
}

constexpr OperandRole kRoles[3] = {OperandRole::kQ, OperandRole::kK, OperandRole::kV};

// Quantizes (timed) and runs the engine (timed) once for `recipe` on the inputs; then poisons
// the output (0xFFFF: a BF16 NaN) and runs once more, so that rows the engine leaves unwritten
// show up in the accuracy check. Leaves that output on the device for the caller.
std::optional<FwdProblem> run_engine(const FwdPoint& p, Recipe recipe, const void* xq,
                                     const void* xk, const void* xv, const FwdOptions& opt,
                                     cudaStream_t stream, FwdRecord* r, bool* fatal) {
  std::optional<FwdProblem> prob(std::in_place, p, recipe, xq, xk, xv, opt.bound);
  Status st = prob->prepare();
  for (int i = 0; i < 3 && st.ok(); ++i) st = prob->quantize(kRoles[i], stream);
  if (!st.ok()) {
    r->error = st.message();
    return std::nullopt;
  }
  if ((r->error = pending_cuda_error(stream, fatal)) != "") return std::nullopt;
  const TimingConfig qt{2, opt.quick ? 5 : 10};
  for (int i = 0; i < 3; ++i) {
    r->quant_ms[i] =
        time_launches([&](int) { (void)prob->quantize(kRoles[i], stream); }, 1, qt, stream)
            .median_ms;
  }
  st = prob->forward(stream);
  if (!st.ok()) {
    r->error = st.message();
    return std::nullopt;
  }
  if ((r->error = pending_cuda_error(stream, fatal)) != "") return std::nullopt;
  r->t = time_adaptive([&](int) { (void)prob->forward(stream); }, opt, stream);
  r->sm_mhz = measure_sm_clock_mhz(stream);
  BENCH_CUDA(cudaMemsetAsync(const_cast<void*>(prob->output()), 0xFF,
                             static_cast<size_t>(2 * p.b * p.s_q * p.h * p.d), stream));
  (void)prob->forward(stream);
  if ((r->error = pending_cuda_error(stream, fatal)) != "") return std::nullopt;
  return prob;
}

HostSlice host_slice(const FwdPoint& p, const void* q, const void* k, const void* v, int64_t batch,
                     int64_t head, cudaStream_t stream) {
  HostSlice x;
  x.s_q = p.s_q;
  x.s_k = p.s_k;
  x.d = p.d;
  x.q = copy_slice_bf16(q, p.s_q, p.h, p.d, batch, head, stream);
  x.k = copy_slice_bf16(k, p.s_k, p.h_kv, p.d, batch, head * p.h_kv / p.h, stream);
  x.v = copy_slice_bf16(v, p.s_k, p.h_kv, p.d, batch, head * p.h_kv / p.h, stream);
  return x;
}

struct Inputs {
  DeviceBuffer q, k, v;
};

Inputs make_inputs(const FwdPoint& p, uint64_t seed, cudaStream_t stream) {
  Inputs in{DeviceBuffer(static_cast<size_t>(2 * p.b * p.s_q * p.h * p.d)),
            DeviceBuffer(static_cast<size_t>(2 * p.b * p.s_k * p.h_kv * p.d)),
            DeviceBuffer(static_cast<size_t>(2 * p.b * p.s_k * p.h_kv * p.d))};
  fill_normal_bf16(in.q.get(), in.q.size() / 2, 3 * seed, stream);
  fill_normal_bf16(in.k.get(), in.k.size() / 2, 3 * seed + 1, stream);
  fill_normal_bf16(in.v.get(), in.v.size() / 2, 3 * seed + 2, stream);
  return in;
}

// The FA3 comparison shape: every row of acc_slices (batch, head) slices spread over the tensor
// (all of them when acc_slices is 0 or >= b * h) against float64; the reference of each slice is
// computed once and shared by the recipes.
void run_fa3_accuracy(FwdRun* s, cudaStream_t stream, bool* fatal) {
  const FwdOptions& opt = *s->opt;
  const FwdPoint p = fa3_accuracy_point();
  const int64_t total = p.b * p.h;
  const int64_t n = opt.acc_slices <= 0 ? total : std::min<int64_t>(opt.acc_slices, total);
  std::vector<std::pair<int64_t, int64_t>> slices;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = i * total / n;
    slices.emplace_back(idx / p.h, idx % p.h);
  }
  Inputs in = make_inputs(p, opt.seed * 1000 + 999, stream);
  std::vector<std::vector<double>> refs;
  for (const auto& [batch, head] : slices) {
    refs.emplace_back();
    const Status st =
        reference_slice(host_slice(p, in.q.get(), in.k.get(), in.v.get(), batch, head, stream),
                        p.causal, &refs.back());
    if (!st.ok()) {
      std::fprintf(stderr, "fp4attn_bench: float64 reference failed: %s\n", st.message().c_str());
      return;
    }
  }
  for (const Recipe recipe : opt.recipes) {
    AccuracyRecord a;
    a.p = p;
    a.recipe = recipe;
    a.slices = slices;
    FwdRecord r;
    std::optional<FwdProblem> prob =
        run_engine(p, recipe, in.q.get(), in.k.get(), in.v.get(), opt, stream, &r, fatal);
    a.error = r.error;
    a.t = r.t;
    if (prob) {
      std::vector<double> test_all, ref_all;
      for (size_t i = 0; i < slices.size(); ++i) {
        const std::vector<uint16_t> o = copy_slice_bf16(prob->output(), p.s_q, p.h, p.d,
                                                        slices[i].first, slices[i].second, stream);
        std::vector<double> test(o.size());
        for (size_t j = 0; j < o.size(); ++j) test[j] = bf16_bits_to_double(o[j]);
        const ErrorStats e =
            compare(test.data(), refs[i].data(), static_cast<int64_t>(test.size()));
        a.worst_cos = std::min(a.worst_cos, e.cos);
        a.worst_rel_l2 = std::max(a.worst_rel_l2, e.rel_l2);
        test_all.insert(test_all.end(), test.begin(), test.end());
        ref_all.insert(ref_all.end(), refs[i].begin(), refs[i].end());
      }
      a.acc = compare(test_all.data(), ref_all.data(), static_cast<int64_t>(test_all.size()));
      std::printf(
          "%-22s %-10s %9.4f %8.1f  cos %.7f rel_l2 %.5f (%zu of %lld slices; FA3 FP8: "
          "0.9986, 0.053)\n",
          fa3_case(p).c_str(), recipe_name(recipe), a.t.median_ms, p.flops() / a.t.median_ms / 1e9,
          a.acc.cos, a.acc.rel_l2, slices.size(), static_cast<long long>(total));
    } else {
      std::printf("%-22s %-10s error: %s\n", fa3_case(p).c_str(), recipe_name(recipe),
                  a.error.c_str());
    }
    s->accuracy.push_back(a);
    write_json(*s);
    if (*fatal) return;
  }
}

}  // namespace

int run_fwd_suite(const FwdOptions& opt) {
  const std::vector<FwdPoint> grid = fwd_grid(opt.quick, opt.dims, opt.seqlens);
  if (opt.list) {
    for (const auto& p : grid) {
      std::printf("%-22s b=%-3lld h=%-3lld s=%-6lld d=%-4lld %.4g GFLOP\n", p.name().c_str(),
                  static_cast<long long>(p.b), static_cast<long long>(p.h),
                  static_cast<long long>(p.s_q), static_cast<long long>(p.d), p.flops() / 1e9);
    }
    return 0;
  }
  BENCH_CUDA(cudaSetDevice(opt.device));
  FwdRun s;
  s.opt = &opt;
  s.dev = device_info(opt.device);
  int peak_khz = 0;
  if (cudaDeviceGetAttribute(&peak_khz, cudaDevAttrClockRate, opt.device) == cudaSuccess) {
    s.peak_mhz = peak_khz / 1e3;
  }
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  s.before = read_clocks(opt.device);
  s.date = utc_now_iso();
  std::printf("fwd suite on %s (%d SMs), %zu points x %zu recipes\n", s.dev.name.c_str(), s.dev.sms,
              grid.size(), opt.recipes.size());
  s.copy = measure_copy(s.dev, opt.timing, stream);
  std::printf("copy ceiling %.3f TB/s (memcpy %.3f, kernel %.3f)\n", s.copy.tbps,
              s.copy.memcpy_tbps, s.copy.kernel_tbps);
  print_header();
  bool fatal = false;
  for (size_t i = 0; i < grid.size() && !fatal; ++i) {
    const FwdPoint& p = grid[i];
    Inputs in = make_inputs(p, opt.seed * 1000 + i, stream);
    // The sampled slice: the last batch and a middle head, so that offsets past the first slice
    // are exercised.
    const int64_t batch = p.b - 1, head = p.h / 2;
    const HostSlice x = host_slice(p, in.q.get(), in.k.get(), in.v.get(), batch, head, stream);
    const std::vector<int64_t> rows = sample_rows(p.s_q, opt.sample_rows);
    std::vector<double> ref;
    const Status ref_st = reference_rows(x, rows, p.causal, &ref);
    for (const Recipe recipe : opt.recipes) {
      FwdRecord r;
      r.p = p;
      r.recipe = recipe;
      std::optional<FwdProblem> prob =
          run_engine(p, recipe, in.q.get(), in.k.get(), in.v.get(), opt, stream, &r, &fatal);
      if (prob && !ref_st.ok()) r.error = "float64 reference: " + ref_st.message();
      if (prob && ref_st.ok()) {
        const std::vector<uint16_t> o =
            copy_slice_bf16(prob->output(), p.s_q, p.h, p.d, batch, head, stream);
        const std::vector<double> test = pick_rows(o, p.d, rows);
        r.acc = compare(test.data(), ref.data(), static_cast<int64_t>(test.size()));
        r.acc_rows = static_cast<int64_t>(rows.size());
        r.acc_batch = batch;
        r.acc_head = head;
      }
      print_record(r);
      s.records.push_back(r);
      if (fatal) break;
    }
    write_json(s);
  }
  if (!fatal && opt.fa3_accuracy) run_fa3_accuracy(&s, stream, &fatal);
  s.after = read_clocks(opt.device);
  s.complete = !fatal;
  const bool written = write_json(s);
  std::printf(
      "SM clock under load %.0f MHz (median of the points; peak %.0f); nvidia-smi %.0f -> "
      "%.0f MHz\nwrote %s\n",
      median_clock(s), s.peak_mhz, s.before.sm_mhz, s.after.sm_mhz, opt.out_path.c_str());
  cudaStreamDestroy(stream);
  int failed = 0;
  for (const auto& r : s.records) failed += !r.error.empty();
  for (const auto& a : s.accuracy) failed += !a.error.empty();
  return fatal || failed || !written ? 1 : 0;
}

}  // namespace fp4attn::bench
