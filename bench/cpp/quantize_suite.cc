// The "quantize" suite: every GPU quantizer of quantize_cases.cu at several input sizes, and the
// device copy ceiling at the same sizes in the same run. tbps counts the bytes a case must read
// plus the bytes it writes; efficiency = tbps / copy_tbps (docs/benchmarks.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "copy.h"
#include "quantize_cases.h"
#include "record.h"
#include "suite_args.h"
#include "suites.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

double tbps(int64_t bytes, double ms) { return ms > 0 ? static_cast<double>(bytes) / ms / 1e9 : 0; }

std::string size_label(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    std::snprintf(buf, sizeof buf, "%lldG", static_cast<long long>(bytes >> 30));
  } else {
    std::snprintf(buf, sizeof buf, "%lldM", static_cast<long long>(bytes >> 20));
  }
  return buf;
}

// [b, s, h, d] for a BF16 input of about `bytes`: h * d = hidden, s = min(tokens, max_seqlen).
bool shape_for(const QuantizeOptions& opt, int64_t bytes, Shape* p) {
  const int64_t tokens = bytes / 2 / opt.hidden;
  if (tokens < 1 || opt.hidden % opt.head_dim != 0) return false;
  p->d = opt.head_dim;
  p->h = opt.hidden / opt.head_dim;
  p->s = std::min(tokens, opt.max_seqlen);
  p->b = tokens / p->s;
  return true;
}

struct Record {
  const QuantizeCase* c;
  Shape shape;
  Timing t;
  int slots = 0;
  std::string error;
};

struct CopyResult {
  int64_t bytes = 0;
  int slots = 0;
  double memcpy_tbps = 0, kernel_tbps = 0;
};

// "16M" -> 16 MiB, "2G" -> 2 GiB, "4096" -> bytes; 0 when malformed.
int64_t parse_size(std::string_view s) {
  if (s.empty()) return 0;
  int64_t mult = 1;
  const char last = s.back();
  if (last == 'K' || last == 'k') mult = int64_t{1} << 10;
  if (last == 'M' || last == 'm') mult = int64_t{1} << 20;
  if (last == 'G' || last == 'g') mult = int64_t{1} << 30;
  if (mult != 1) s.remove_suffix(1);
  char* end = nullptr;
  const std::string digits(s);
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || v <= 0) return 0;
  return v * mult;
}

}  // namespace

int run_quantize_suite(const QuantizeOptions& opt) {
  const std::vector<QuantizeCase> all = quantize_cases();
  std::vector<const QuantizeCase*> cases;
  for (const auto& c : all) {
    if (opt.filter.empty() || c.name.find(opt.filter) != std::string::npos) cases.push_back(&c);
  }
  if (opt.list) {
    for (const auto* c : cases) {
      std::printf("%-26s recipe=%-10s form=%-10s global_scale=%-9s passes=%d\n", c->name.c_str(),
                  c->recipe.c_str(), c->form.c_str(), c->global_scale.c_str(), c->passes);
    }
    return 0;
  }

  BENCH_CUDA(cudaSetDevice(opt.device));
  const DeviceInfo dev = device_info(opt.device);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("quantize suite on %s (%d SMs, L2 %zu MB), %zu cases\n", dev.name.c_str(), dev.sms,
              dev.l2_bytes >> 20, cases.size());
  const Clocks clocks_before = read_clocks(opt.device);
  const std::string date = utc_now_iso();

  std::vector<Record> records;
  std::vector<CopyResult> copies;
  bool fatal = false;
  std::printf("%-6s %-26s %-9s %10s %8s  %s\n", "input", "case", "g.scale", "ms", "TB/s", "slots");
  for (const int64_t want : opt.sizes) {
    Shape p;
    if (!shape_for(opt, want, &p)) {
      std::fprintf(stderr, "fp4attn_bench: size %lld bytes is too small\n",
                   static_cast<long long>(want));
      return 2;
    }
    const int64_t in_bytes = p.input_bytes();
    const int slots = rotation_slots(static_cast<size_t>(in_bytes), dev.l2_bytes);
    size_t free_mem = 0, total_mem = 0;
    BENCH_CUDA(cudaMemGetInfo(&free_mem, &total_mem));
    if (static_cast<double>(slots) * 3 * in_bytes > 0.9 * static_cast<double>(free_mem)) {
      std::fprintf(stderr, "fp4attn_bench: skipping %s: not enough device memory\n",
                   size_label(in_bytes).c_str());
      continue;
    }
    // Per slot: the input and an output arena of twice its bytes (the copy's destination too).
    std::vector<DeviceBuffer> x, out;
    std::vector<CaseIO> io(slots);
    for (int i = 0; i < slots; ++i) {
      x.emplace_back(static_cast<size_t>(in_bytes));
      out.emplace_back(static_cast<size_t>(2 * in_bytes));
      fill_random_bf16(x.back().get(), static_cast<size_t>(p.numel()), 1000 + i, stream);
      io[i].x = make_view(x.back().get(), DType::kBF16, {p.b, p.s, p.h, p.d});
      io[i].out = out.back().bytes();
      io[i].out_bytes = out.back().size();
      io[i].shape = p;
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));
    const std::string label = size_label(in_bytes);

    CopyResult copy;
    copy.bytes = in_bytes;
    copy.slots = slots;
    const Timing tm = time_launches(
        [&](int s) {
          BENCH_CUDA(cudaMemcpyAsync(out[s].get(), x[s].get(), static_cast<size_t>(in_bytes),
                                     cudaMemcpyDeviceToDevice, stream));
        },
        slots, opt.timing, stream);
    const Timing tk = time_launches(
        [&](int s) {
          launch_copy_kernel(out[s].get(), x[s].get(), static_cast<size_t>(in_bytes), dev.sms,
                             stream);
        },
        slots, opt.timing, stream);
    copy.memcpy_tbps = tbps(2 * in_bytes, tm.median_ms);
    copy.kernel_tbps = tbps(2 * in_bytes, tk.median_ms);
    copies.push_back(copy);
    std::printf("%-6s %-26s %-9s %10.4f %8.3f  %d\n", label.c_str(), "copy (cudaMemcpyAsync)", "-",
                tm.median_ms, copy.memcpy_tbps, slots);
    std::printf("%-6s %-26s %-9s %10.4f %8.3f  %d\n", label.c_str(), "copy (kernel)", "-",
                tk.median_ms, copy.kernel_tbps, slots);

    for (const QuantizeCase* c : cases) {
      Record r{c, p, {}, slots, {}};
      const Status st = c->launch(io[0], stream);
      const cudaError_t launched = cudaGetLastError();
      const cudaError_t synced = cudaStreamSynchronize(stream);
      if (!st.ok()) {
        r.error = st.message();
      } else if (launched != cudaSuccess || synced != cudaSuccess) {
        r.error = cudaGetErrorString(launched != cudaSuccess ? launched : synced);
        fatal = synced != cudaSuccess;  // a failed kernel leaves the context unusable
      } else {
        r.t = time_launches([&](int s) { (void)c->launch(io[s], stream); }, slots, opt.timing,
                            stream);
      }
      records.push_back(r);
      const int64_t moved = c->bytes_read(p) + c->bytes_written(p);
      if (r.error.empty()) {
        std::printf("%-6s %-26s %-9s %10.4f %8.3f  %d\n", label.c_str(), c->name.c_str(),
                    c->global_scale.c_str(), r.t.median_ms, tbps(moved, r.t.median_ms), slots);
      } else {
        std::printf("%-6s %-26s %-9s  error: %s\n", label.c_str(), c->name.c_str(),
                    c->global_scale.c_str(), r.error.c_str());
      }
      if (fatal) break;
    }
    std::fflush(stdout);
    if (fatal) break;
  }
  const Clocks clocks_after = read_clocks(opt.device);

  // The ceiling: the better of the two copies at the largest size measured.
  double copy_ceiling = 0, copy_memcpy = 0, copy_kernel = 0;
  int64_t ceiling_bytes = 0;
  for (const auto& c : copies) {
    if (c.bytes >= ceiling_bytes) {
      ceiling_bytes = c.bytes;
      copy_memcpy = c.memcpy_tbps;
      copy_kernel = c.kernel_tbps;
      copy_ceiling = std::max(c.memcpy_tbps, c.kernel_tbps);
    }
  }

  std::vector<std::string> rec_json, copy_json;
  for (const auto& r : records) {
    const int64_t rd = r.c->bytes_read(r.shape), wr = r.c->bytes_written(r.shape);
    JsonObject o;
    o.str("case", r.c->name)
        .str("recipe", r.c->recipe)
        .str("form", r.c->form)
        .str("global_scale", r.c->global_scale)
        .integer("passes", r.c->passes)
        .integer("bytes", r.shape.input_bytes())
        .integer("b", r.shape.b)
        .integer("s", r.shape.s)
        .integer("h", r.shape.h)
        .integer("d", r.shape.d)
        .integer("bytes_read", rd)
        .integer("bytes_written", wr);
    if (!r.error.empty()) {
      o.str("error", r.error);
    } else {
      const double bw = tbps(rd + wr, r.t.median_ms);
      o.num("ms", r.t.median_ms, 5)
          .num("ms_min", r.t.min_ms, 5)
          .num("ms_max", r.t.max_ms, 5)
          .num("tbps", bw, 4)
          .num("efficiency", copy_ceiling > 0 ? bw / copy_ceiling : 0, 4)
          .integer("slots", r.slots);
    }
    rec_json.push_back(o.render());
  }
  for (const auto& c : copies) {
    copy_json.push_back(JsonObject()
                            .integer("bytes", c.bytes)
                            .num("memcpy_tbps", c.memcpy_tbps, 4)
                            .num("kernel_tbps", c.kernel_tbps, 4)
                            .integer("slots", c.slots)
                            .render());
  }

  JsonObject doc = record_header("quantize", false, opt, dev.name, date);
  doc.raw("ceilings", JsonObject()
                          .num("copy_tbps", copy_ceiling, 4)
                          .num("copy_memcpy_tbps", copy_memcpy, 4)
                          .num("copy_kernel_tbps", copy_kernel, 4)
                          .integer("copy_bytes", ceiling_bytes)
                          .render())
      .raw("clocks", JsonObject()
                         .raw("before", clocks_json(clocks_before).render())
                         .raw("after", clocks_json(clocks_after).render())
                         .render())
      .raw("config", JsonObject()
                         .integer("sms", dev.sms)
                         .integer("l2_bytes", static_cast<long long>(dev.l2_bytes))
                         .integer("warmup", opt.timing.warmup)
                         .integer("reps", opt.timing.reps)
                         .str("layout", "BSHD BF16, h*d = " + std::to_string(opt.hidden))
                         .render())
      .raw("copy", json_array_lines(copy_json))
      .raw("records", json_array_lines(rec_json));

  if (!write_record(opt, doc)) return 1;
  std::printf(
      "copy ceiling %.3f TB/s (memcpy %.3f, kernel %.3f at %s); SM clock %.0f -> %.0f MHz\n",
      copy_ceiling, copy_memcpy, copy_kernel, size_label(ceiling_bytes).c_str(),
      clocks_before.sm_mhz, clocks_after.sm_mhz);
  std::printf("wrote %s\n", opt.out_path.c_str());
  cudaStreamDestroy(stream);
  int failed = 0;
  for (const auto& r : records) failed += !r.error.empty();
  return fatal || failed ? 1 : 0;
}

int quantize_main(const std::vector<std::string>& argv, const std::string& command) {
  const std::vector<FlagSpec> flags = suite_flags(
      {
          {"sizes", true, "BF16 input sizes per call", "16M,256M,1G,2G (quick: 16M,256M)"},
          {"quick", false, "16M,256M and 10 timed samples", ""},
          {"warmup", true, "warm-up samples", "3"},
          {"reps", true, "timed samples, median reported", "20"},
          {"filter", true, "only the cases whose name contains this", ""},
          {"head-dim", true, "64 or 128 (h = 2048 / head-dim)", "128"},
          {"list", false, "print the cases and exit", ""},
      },
      "quantize.json");
  const Args a(argv, flags);
  if (print_help(a,
                 "usage: fp4attn_bench quantize [flags]\n\nTimes every GPU quantizer against "
                 "the device copy ceiling of the same run.",
                 flags)) {
    return 0;
  }
  QuantizeOptions opt;
  read_suite_flags(a, "quantize.json", command, &opt);
  const bool quick = a.has("quick");
  for (const std::string& item : a.get_list("sizes", quick ? "16M,256M" : "16M,256M,1G,2G")) {
    const int64_t bytes = parse_size(item);
    if (bytes == 0) {
      throw UsageError("--sizes: expected sizes such as 16M,256M,1G, got '" + item + "'");
    }
    opt.sizes.push_back(bytes);
  }
  opt.timing.warmup = static_cast<int>(a.get_int("warmup", 3, 0, 1000));
  opt.timing.reps = static_cast<int>(a.get_int("reps", quick ? 10 : 20, 1, 100000));
  opt.filter = a.get("filter", "");
  opt.list = a.has("list");
  opt.head_dim = a.get_int("head-dim", 128, 64, 128);
  if (opt.head_dim != 64 && opt.head_dim != 128) {
    throw UsageError("--head-dim: expected 64 or 128, got " + std::to_string(opt.head_dim));
  }
  return run_quantize_suite(opt);
}

}  // namespace fp4attn::bench
