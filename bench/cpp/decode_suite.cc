// The decode suite (decode_suite.h). For each grid point (b sequences of L cached tokens, h = 32
// query heads over h_kv = 8, d = 128, one query token, page size 16) and each cache format: the
// tokens are N(0, 1) BF16 (Box-Muller on the GPU, the same draw for every format), written with
// paged_kv_append_cuda (the first append calibrates the globals) through a page table of shuffled
// page ids; then paged_attention_cuda is timed with CUDA events (warm-up, then at least min_reps
// calls and min_time_ms, median), rotating over copies of the cache when one copy fits in the
// L2 (each pass touches >= 4x the L2, so the reads come from HBM); bytes counted are those the
// call must read (cache data + scales of every cached token, q, block table, seq_lens). Then the
// output is poisoned and recomputed, and one sequence (the last, every head) is compared with a
// float64 attention on its unquantized BF16 tokens. The read-only ceiling (a 16-byte load kernel
// over 2 GiB) and the copy ceiling are measured first. The JSON is rewritten after every point.
#include "decode_suite.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "copy.h"
#include "decode_device.h"
#include "fp4attn/paged_attention_cuda.h"
#include "fp4attn/paged_kv_cuda.h"
#include "fwd_device.h"
#include "harness/metrics.h"
#include "record.h"
#include "suite_args.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double bf16_to_double(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// "b32-L4096" (snprintf: GCC 12 warns falsely (-Wrestrict) on the operator+ chain here).
std::string case_name(int64_t b, int64_t len) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "b%lld-L%lld", static_cast<long long>(b),
                static_cast<long long>(len));
  return buf;
}

struct Ceilings {
  double read_tbps = 0, copy_tbps = 0;
  int64_t bytes = 0;
};

Ceilings measure_ceilings(const DeviceInfo& dev, const TimingConfig& timing, cudaStream_t stream) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer src(bytes), dst(bytes / 2), sink(64);
  fill_random_bf16(src.get(), bytes / 2, 11, stream);
  const Timing tr = time_launches(
      [&](int) {
        launch_read_kernel(src.get(), bytes, static_cast<uint32_t*>(sink.get()), dev.sms, stream);
      },
      1, timing, stream);
  const Timing tc = time_launches(
      [&](int) { launch_copy_kernel(dst.get(), src.get(), bytes / 2, dev.sms, stream); }, 1, timing,
      stream);
  Ceilings c;
  c.bytes = static_cast<int64_t>(bytes);
  c.read_tbps = bytes / tr.median_ms / 1e9;
  c.copy_tbps = 2.0 * (bytes / 2) / tc.median_ms / 1e9;
  return c;
}

// One page pool holding `slots` copies of a cache of `pages` pages (compact arrays K data, K
// scales, V data, V scales), copy r in pages [r * pages, (r + 1) * pages).
struct Pool {
  KvCacheFormat format;
  int64_t pages = 0, slots = 1, page_size = 0, h_kv = 0, d = 0;
  int64_t row_data = 0, row_scales = 0;
  DeviceBuffer k_data, v_data, k_scales, v_scales, globals;

  int64_t page_bytes_data() const { return page_size * h_kv * row_data; }
  int64_t page_bytes_scales() const { return page_size * h_kv * row_scales; }
  int64_t cache_bytes() const { return pages * (page_bytes_data() + page_bytes_scales()) * 2; }
  PagedKvCache views() const {
    const int64_t total = pages * slots;
    PagedKvCache c{};
    c.format = format;
    c.k_data = make_view(k_data.get(), DType::kU8, {total, page_size, h_kv, row_data});
    c.v_data = make_view(v_data.get(), DType::kU8, {total, page_size, h_kv, row_data});
    if (format == KvCacheFormat::kNvfp4) {
      c.k_scales = make_view(k_scales.get(), DType::kU8, {total, page_size, h_kv, row_scales});
      c.v_scales = make_view(v_scales.get(), DType::kU8, {total, page_size, h_kv, row_scales});
    }
    c.k_global = make_view(globals.get(), DType::kF32, {1});
    c.v_global = make_view(static_cast<float*>(globals.get()) + 1, DType::kF32, {1});
    return c;
  }
};

struct Point {
  int64_t b, len;
};

// What a grid point shares between the formats: page table, tokens' seeds, the query, the float64
// reference of the sampled sequence.
struct Shared {
  Point pt;
  int64_t pages = 0, max_pages = 0;
  std::vector<int32_t> table;  // copy 0: [b, max_pages]
  DeviceBuffer q;
  std::vector<uint16_t> q_host_seq;    // [h, d] of the sampled sequence
  std::vector<uint16_t> k_seq, v_seq;  // sampled sequence's tokens [L, h_kv, d]
  std::vector<double> ref;             // [h, d]
  bool have_ref = false;
};

constexpr int64_t kChunkTokens = 32768;

// Appends the point's tokens into copy 0 of the pool (calibrating the globals), keeping the
// sampled sequence's BF16 tokens on the host, then copies copy 0 into the other slots.
Status fill_pool(const DecodeOptions& opt, Shared& sh, Pool& pool, bool keep_tokens,
                 cudaStream_t stream) {
  const int64_t b = sh.pt.b, len = sh.pt.len, total = b * len, row = opt.h_kv * opt.d;
  const int64_t chunk = std::min(kChunkTokens, total);
  DeviceBuffer kb(static_cast<size_t>(chunk * row * 2)), vb(static_cast<size_t>(chunk * row * 2));
  DeviceBuffer slots_dev(static_cast<size_t>(chunk * 4));
  std::vector<int32_t> slots(chunk);
  const int64_t sample = b - 1;
  if (keep_tokens) {
    sh.k_seq.assign(len * row, 0);
    sh.v_seq.assign(len * row, 0);
  }
  BENCH_CUDA(cudaMemsetAsync(pool.globals.get(), 0, 8, stream));
  for (int64_t t0 = 0, c = 0; t0 < total; t0 += chunk, ++c) {
    const int64_t n = std::min(chunk, total - t0);
    fill_normal_bf16(kb.get(), static_cast<size_t>(n * row), opt.seed * 1000003 + 2 * c, stream);
    fill_normal_bf16(vb.get(), static_cast<size_t>(n * row), opt.seed * 1000003 + 2 * c + 1,
                     stream);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t tok = t0 + i, bi = tok / len, j = tok % len;
      slots[i] = static_cast<int32_t>(paged_kv_slot(sh.table[bi * sh.max_pages + j / opt.page_size],
                                                    opt.page_size, j % opt.page_size));
    }
    BENCH_CUDA(
        cudaMemcpyAsync(slots_dev.get(), slots.data(), n * 4, cudaMemcpyHostToDevice, stream));
    PagedAppendCudaOptions aopt;  // calibrates on the first chunk
    const PagedKvCache c0 = pool.views();
    const Status st =
        paged_kv_append_cuda(make_view(kb.get(), DType::kBF16, {n, opt.h_kv, opt.d}),
                             make_view(vb.get(), DType::kBF16, {n, opt.h_kv, opt.d}),
                             make_view(slots_dev.get(), DType::kI32, {n}), c0, aopt, stream);
    if (!st.ok()) return st;
    if (keep_tokens) {
      const int64_t lo = std::max(t0, sample * len), hi = std::min(t0 + n, (sample + 1) * len);
      if (lo < hi) {
        const size_t off = static_cast<size_t>((lo - t0) * row * 2);
        const size_t bytes = static_cast<size_t>((hi - lo) * row * 2);
        BENCH_CUDA(cudaMemcpyAsync(sh.k_seq.data() + (lo - sample * len) * row, kb.bytes() + off,
                                   bytes, cudaMemcpyDeviceToHost, stream));
        BENCH_CUDA(cudaMemcpyAsync(sh.v_seq.data() + (lo - sample * len) * row, vb.bytes() + off,
                                   bytes, cudaMemcpyDeviceToHost, stream));
      }
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));  // the host slot buffer is reused
  }
  const int64_t pd = pool.pages * pool.page_bytes_data(),
                ps = pool.pages * pool.page_bytes_scales();
  for (int64_t r = 1; r < pool.slots; ++r) {
    BENCH_CUDA(cudaMemcpyAsync(pool.k_data.bytes() + r * pd, pool.k_data.get(), pd,
                               cudaMemcpyDeviceToDevice, stream));
    BENCH_CUDA(cudaMemcpyAsync(pool.v_data.bytes() + r * pd, pool.v_data.get(), pd,
                               cudaMemcpyDeviceToDevice, stream));
    if (ps > 0) {
      BENCH_CUDA(cudaMemcpyAsync(pool.k_scales.bytes() + r * ps, pool.k_scales.get(), ps,
                                 cudaMemcpyDeviceToDevice, stream));
      BENCH_CUDA(cudaMemcpyAsync(pool.v_scales.bytes() + r * ps, pool.v_scales.get(), ps,
                                 cudaMemcpyDeviceToDevice, stream));
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return Status::Ok();
}

// float64 attention of the sampled sequence's single query over its unquantized tokens, every
// head (threads over heads).
void reference(const DecodeOptions& opt, Shared& sh) {
  const int64_t len = sh.pt.len, h = opt.h, d = opt.d, group = opt.h / opt.h_kv;
  sh.ref.assign(h * d, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto head = [&](int64_t hq) {
    const int64_t hk = hq / group;
    std::vector<double> s(len), q(d);
    for (int64_t e = 0; e < d; ++e) q[e] = bf16_to_double(sh.q_host_seq[hq * d + e]);
    double m = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
      const uint16_t* k = sh.k_seq.data() + (j * opt.h_kv + hk) * d;
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += q[e] * bf16_to_double(k[e]);
      s[j] = acc * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - m));
    double* o = sh.ref.data() + hq * d;
    for (int64_t j = 0; j < len; ++j) {
      const uint16_t* v = sh.v_seq.data() + (j * opt.h_kv + hk) * d;
      const double w = s[j] / sum;
      for (int64_t e = 0; e < d; ++e) o[e] += w * bf16_to_double(v[e]);
    }
  };
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(h, static_cast<int64_t>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t hq = t; hq < h; hq += threads) head(hq);
    });
  }
  for (auto& th : pool) th.join();
  sh.have_ref = true;
}

struct Record {
  Point pt;
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  std::string error;
  Timing t;
  int64_t bytes = 0, cache_bytes = 0, splits = 1, split_size = 0, slots = 1;
  double sm_mhz = 0;
  ErrorStats acc;
  bool have_acc = false;
};

struct Run {
  const DecodeOptions* opt = nullptr;
  DeviceInfo dev;
  std::string date;
  Clocks before, after;
  Ceilings ceil;
  std::vector<Record> records;
  bool complete = false;
};

std::string record_json(const Run& s, const Record& r) {
  const DecodeOptions& o = *s.opt;
  JsonObject j;
  j.str("case", case_name(r.pt.b, r.pt.len))
      .str("recipe", kv_cache_format_name(r.format))
      .integer("b", r.pt.b)
      .integer("h", o.h)
      .integer("h_kv", o.h_kv)
      .integer("s_q", o.s_q)
      .integer("s_k", r.pt.len)
      .integer("d", o.d)
      .integer("page_size", o.page_size);
  if (!r.error.empty()) return j.str("error", r.error).render();
  const double tbps = r.bytes / r.t.median_ms / 1e9;
  j.num("ms", r.t.median_ms, 5)
      .num("ms_min", r.t.min_ms, 5)
      .num("ms_max", r.t.max_ms, 5)
      .integer("reps", r.t.samples)
      .integer("bytes", r.bytes)
      .integer("cache_bytes", r.cache_bytes)
      .num("tbps", tbps, 5)
      .num("fraction_of_read", tbps / s.ceil.read_tbps, 4)
      .integer("splits", r.splits)
      .integer("split_size", r.split_size)
      .integer("slots", r.slots)
      .num("sm_mhz", r.sm_mhz, 5);
  if (r.have_acc) {
    j.num("cos", r.acc.cos, 8)
        .num("rel_l2", r.acc.rel_l2, 5)
        .num("max_abs", r.acc.max_abs, 4)
        .integer("nan_mismatch", r.acc.nan_mismatch)
        .integer("acc_batch", r.pt.b - 1);
  }
  return j.render();
}

bool write_json(const Run& s) {
  const DecodeOptions& o = *s.opt;
  std::vector<std::string> recs;
  for (const auto& r : s.records) recs.push_back(record_json(s, r));
  std::string formats;
  for (const auto f : o.formats)
    formats += std::string(formats.empty() ? "" : ",") + kv_cache_format_name(f);
  JsonObject doc = record_header("decode", true, o, s.dev.name, s.date);
  doc.boolean("complete", s.complete)
      .raw("ceilings", JsonObject()
                           .num("read_tbps", s.ceil.read_tbps, 4)
                           .num("copy_tbps", s.ceil.copy_tbps, 4)
                           .integer("read_bytes", s.ceil.bytes)
                           .render())
      .obj("clocks",
           JsonObject().obj("before", clocks_json(s.before)).obj("after", clocks_json(s.after)))
      .raw("config",
           JsonObject()
               .integer("sms", s.dev.sms)
               .integer("l2_bytes", static_cast<long long>(s.dev.l2_bytes))
               .str("recipes", formats)
               .integer("warmup", o.timing.warmup)
               .integer("min_reps", o.min_reps)
               .num("min_time_ms", o.min_time_ms)
               .integer("seed", static_cast<long long>(o.seed))
               .str("inputs",
                    "k, v, q N(0, 1) BF16 (Box-Muller on the GPU); cache written by "
                    "paged_kv_append_cuda (globals calibrated by the first append), shuffled page "
                    "ids, every sequence L tokens")
               .str("bytes",
                    "cache data + scales of every cached token, q, block table, seq_lens: what a "
                    "call must read; tbps = bytes / ms")
               .str("timing",
                    "CUDA events, median; caches smaller than 4x the L2 rotate over copies "
                    "(slots) so that reads come from HBM; split partials in a preallocated "
                    "workspace; LSE output on")
               .str("accuracy",
                    "the last sequence, every head, against float64 attention on its unquantized "
                    "BF16 tokens")
               .render())
      .raw("records", json_array_lines(recs));
  return write_record(o, doc);
}

Timing time_adaptive(const std::function<void(int)>& call, int slots, const DecodeOptions& opt,
                     cudaStream_t stream) {
  const Timing est = time_launches(call, slots, {opt.timing.warmup, 3}, stream);
  int reps = opt.min_reps;
  if (est.median_ms > 0) {
    reps = std::max(reps, static_cast<int>(std::ceil(opt.min_time_ms / (est.median_ms * slots))));
  }
  reps = std::clamp(reps, 1, std::max(opt.max_reps, opt.min_reps));
  return time_launches(call, slots, {1, reps}, stream);
}

void run_point(const DecodeOptions& opt, Run& run, Shared& sh, KvCacheFormat format,
               cudaStream_t stream, bool* fatal) {
  Record r;
  r.pt = sh.pt;
  r.format = format;
  const int64_t b = sh.pt.b, len = sh.pt.len;
  Pool pool;
  pool.format = format;
  pool.pages = sh.pages;
  pool.page_size = opt.page_size;
  pool.h_kv = opt.h_kv;
  pool.d = opt.d;
  const bool fp4 = format == KvCacheFormat::kNvfp4;
  pool.row_data = fp4 ? opt.d / 2 : opt.d;
  pool.row_scales = fp4 ? opt.d / 16 : 0;
  r.cache_bytes = b * len * opt.h_kv * (pool.row_data + pool.row_scales) * 2;
  pool.slots = rotation_slots(static_cast<size_t>(pool.cache_bytes()), run.dev.l2_bytes, 64);
  r.slots = pool.slots;
  const int64_t total = pool.pages * pool.slots;
  pool.k_data = DeviceBuffer(static_cast<size_t>(total * pool.page_bytes_data()));
  pool.v_data = DeviceBuffer(static_cast<size_t>(total * pool.page_bytes_data()));
  if (fp4) {
    pool.k_scales = DeviceBuffer(static_cast<size_t>(total * pool.page_bytes_scales()));
    pool.v_scales = DeviceBuffer(static_cast<size_t>(total * pool.page_bytes_scales()));
  }
  pool.globals = DeviceBuffer(64);
  Status st = fill_pool(opt, sh, pool, opt.accuracy && sh.k_seq.empty(), stream);
  if (st.ok() && opt.accuracy && !sh.have_ref) reference(opt, sh);
  // Block tables of every slot, seq_lens.
  std::vector<int32_t> tables(sh.table.size() * pool.slots);
  for (int64_t s = 0; s < pool.slots; ++s) {
    for (size_t i = 0; i < sh.table.size(); ++i) {
      tables[s * sh.table.size() + i] =
          sh.table[i] < 0 ? -1 : static_cast<int32_t>(sh.table[i] + s * pool.pages);
    }
  }
  std::vector<int32_t> lens(b, static_cast<int32_t>(len));
  DeviceBuffer tables_dev(tables.size() * 4), lens_dev(lens.size() * 4);
  BENCH_CUDA(
      cudaMemcpy(tables_dev.get(), tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(lens_dev.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  DeviceBuffer o(static_cast<size_t>(b * opt.h * opt.d * 2)),
      lse(static_cast<size_t>(b * opt.h * 4));
  int64_t splits = 1, split_size = 0;
  const int64_t rows = opt.s_q * (opt.h / opt.h_kv);
  paged_attention_split_plan(b, opt.h_kv, ceil_div(rows, 16), len, 0, &splits, &split_size,
                             paged_decode_ctas_per_sm(opt.d, fp4, rows));
  r.splits = splits;
  r.split_size = split_size;
  const size_t ws_bytes = paged_attention_workspace_bytes(splits, b * opt.s_q, opt.h, opt.d);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
  // Zeroed once: every call leaves the fused combine's counters zero, so the calls skip their
  // memset (copt.workspace_is_clean), as a serving loop with a persistent workspace would.
  BENCH_CUDA(cudaMemset(ws.get(), 0, ws.size()));
  std::vector<int32_t> table0(sh.table);
  const PagedKvCache cache = pool.views();
  const TensorView q = make_view(sh.q.get(), DType::kBF16, {b, opt.s_q, opt.h, opt.d});
  const TensorView ov = make_view(o.get(), DType::kBF16, {b, opt.s_q, opt.h, opt.d});
  const TensorView lv = make_view(lse.get(), DType::kF32, {b, opt.h, opt.s_q});
  PagedAttentionOptions aopt;
  PagedAttentionCudaOptions copt;
  copt.workspace = ws.get();
  copt.workspace_bytes = ws.size();
  copt.workspace_is_clean = true;
  // The host copies of slot 0's indices (value checks, and the split plan's max_len = L).
  copt.block_tables_host = make_view(table0.data(), DType::kI32, {b, sh.max_pages});
  copt.seq_lens_host = make_view(lens.data(), DType::kI32, {b});
  copt.num_splits = static_cast<int>(splits);
  auto call = [&](int slot) {
    return paged_attention_cuda(
        q, {}, cache,
        make_view(static_cast<int32_t*>(tables_dev.get()) + slot * sh.table.size(), DType::kI32,
                  {b, sh.max_pages}),
        make_view(lens_dev.get(), DType::kI32, {b}), aopt, ov, lv, copt, stream);
  };
  if (st.ok()) st = call(0);
  if (st.ok()) {
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      r.error = cudaGetErrorString(e);
      *fatal = true;
    }
  } else {
    r.error = st.message();
  }
  if (r.error.empty()) {
    // Index checks on the host take microseconds per call at b = 256: time without host copies
    // (the split plan then sees max_pages * page_size = L rounded up to a page, the same plan).
    copt.block_tables_host = TensorView{};
    copt.seq_lens_host = TensorView{};
    bool call_failed = false;
    r.t = time_adaptive([&](int slot) { call_failed = call_failed || !call(slot).ok(); },
                        pool.slots, opt, stream);
    if (call_failed) r.error = "a timed call returned an error";
    r.sm_mhz = measure_sm_clock_mhz(stream);
    r.bytes = r.cache_bytes + b * opt.s_q * opt.h * opt.d * 2 + b * sh.max_pages * 4 + b * 4;
    BENCH_CUDA(cudaMemsetAsync(o.get(), 0xFF, o.size(), stream));
    if (!call(0).ok()) r.error = "the accuracy call returned an error";
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      r.error = cudaGetErrorString(e);
      *fatal = true;
    } else if (sh.have_ref && r.error.empty()) {
      std::vector<uint16_t> out(opt.h * opt.d);
      BENCH_CUDA(cudaMemcpy(out.data(), o.bytes() + (b - 1) * opt.h * opt.d * 2, out.size() * 2,
                            cudaMemcpyDeviceToHost));
      std::vector<double> test(out.size());
      for (size_t i = 0; i < out.size(); ++i) test[i] = bf16_to_double(out[i]);
      r.acc = compare(test.data(), sh.ref.data(), static_cast<int64_t>(test.size()));
      r.have_acc = true;
    }
  }
  if (r.error.empty()) {
    std::printf("%-12s %-6s %9.4f %8.3f %6.3f %3lld %9.6f %8.5f %6.0f\n", case_name(b, len).c_str(),
                kv_cache_format_name(format), r.t.median_ms, r.bytes / r.t.median_ms / 1e9,
                r.bytes / r.t.median_ms / 1e9 / run.ceil.read_tbps,
                static_cast<long long>(r.splits), r.acc.cos, r.acc.rel_l2, r.sm_mhz);
  } else {
    std::printf("%-12s %-6s error: %s\n", case_name(b, len).c_str(), kv_cache_format_name(format),
                r.error.c_str());
  }
  std::fflush(stdout);
  run.records.push_back(r);
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> decode_grid(bool quick) {
  std::vector<std::pair<int64_t, int64_t>> g = {{32, 4096}, {32, 32768}};
  if (quick) {
    g.push_back({1, 32768});
    g.push_back({256, 8192});
    return g;
  }
  for (int64_t b : {1, 8, 64, 256}) {
    for (int64_t len : {1024, 8192, 32768}) g.push_back({b, len});
  }
  return g;
}

int run_decode_suite(const DecodeOptions& opt) {
  const auto grid = opt.points.empty() ? decode_grid(opt.quick) : opt.points;
  if (opt.list) {
    for (const auto& [b, len] : grid) {
      std::printf("%-12s b=%-4lld L=%-6lld h=%lld/%lld d=%lld\n", case_name(b, len).c_str(),
                  static_cast<long long>(b), static_cast<long long>(len),
                  static_cast<long long>(opt.h), static_cast<long long>(opt.h_kv),
                  static_cast<long long>(opt.d));
    }
    return 0;
  }
  BENCH_CUDA(cudaSetDevice(opt.device));
  Run run;
  run.opt = &opt;
  run.dev = device_info(opt.device);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run.before = read_clocks(opt.device);
  run.date = utc_now_iso();
  std::printf("decode suite on %s (%d SMs), %zu points x %zu formats\n", run.dev.name.c_str(),
              run.dev.sms, grid.size(), opt.formats.size());
  run.ceil = measure_ceilings(run.dev, opt.timing, stream);
  std::printf("read ceiling %.3f TB/s, copy %.3f TB/s (read + write)\n", run.ceil.read_tbps,
              run.ceil.copy_tbps);
  std::printf("%-12s %-6s %9s %8s %6s %3s %9s %8s %6s\n", "case", "format", "ms", "TB/s", "/read",
              "spl", "cos", "rel_l2", "MHz");
  bool fatal = false;
  for (size_t i = 0; i < grid.size() && !fatal; ++i) {
    Shared sh;
    sh.pt = {grid[i].first, grid[i].second};
    const int64_t b = sh.pt.b, len = sh.pt.len;
    // No spare table column: max_pages * page_size = L (the grid's L are multiples of 16), so the
    // split plan is the same with or without the host copies.
    sh.max_pages = ceil_div(len, opt.page_size);
    sh.pages = b * ceil_div(len, opt.page_size);
    std::vector<int32_t> ids(sh.pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<uint32_t>(opt.seed + i)));
    sh.table.assign(b * sh.max_pages, -1);
    int64_t next = 0;
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t p = 0; p < ceil_div(len, opt.page_size); ++p) {
        sh.table[bi * sh.max_pages + p] = ids[next++];
      }
    }
    sh.q = DeviceBuffer(static_cast<size_t>(b * opt.s_q * opt.h * opt.d * 2));
    fill_normal_bf16(sh.q.get(), sh.q.size() / 2, opt.seed * 7919 + 1000 + i, stream);
    sh.q_host_seq.resize(opt.h * opt.d);
    BENCH_CUDA(cudaMemcpyAsync(sh.q_host_seq.data(), sh.q.bytes() + (b - 1) * opt.h * opt.d * 2,
                               opt.h * opt.d * 2, cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    for (const KvCacheFormat f : opt.formats) {
      run_point(opt, run, sh, f, stream, &fatal);
      write_json(run);
      if (fatal) break;
    }
  }
  run.after = read_clocks(opt.device);
  run.complete = !fatal;
  const bool written = write_json(run);
  std::printf("wrote %s\n", opt.out_path.c_str());
  cudaStreamDestroy(stream);
  int failed = 0;
  for (const auto& r : run.records) failed += !r.error.empty();
  return fatal || failed || !written ? 1 : 0;
}

namespace {

// "32:4096,1:32768": (batch, cached length) pairs.
std::vector<std::pair<int64_t, int64_t>> parse_points(const Args& a) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const std::string& item : a.get_list("points", "")) {
    const size_t colon = item.find(':');
    char* e1 = nullptr;
    char* e2 = nullptr;
    const std::string b_text = item.substr(0, colon), l_text = item.substr(colon + 1);
    const long long b = std::strtoll(b_text.c_str(), &e1, 10);
    const long long l = std::strtoll(l_text.c_str(), &e2, 10);
    if (colon == std::string::npos || b_text.empty() || l_text.empty() || *e1 != '\0' ||
        *e2 != '\0' || b < 1 || l < 1) {
      throw UsageError("--points: expected b:L pairs such as 32:4096,1:32768, got '" + item + "'");
    }
    out.push_back({b, l});
  }
  return out;
}

}  // namespace

int decode_main(const std::vector<std::string>& argv, const std::string& command) {
  const std::vector<FlagSpec> flags = suite_flags(
      {
          {"recipes", true, "cache formats", "nvfp4,fp8"},
          {"quick", false, "4 points: (32, 4k), (32, 32k), (1, 32k), (256, 8k)", ""},
          {"points", true, "b:L pairs instead of the grid, e.g. 32:4096,1:32768", ""},
          {"warmup", true, "warm-up calls", "3"},
          {"reps", true, "at least this many timed calls per point", "20"},
          {"min-time-ms", true, "and at least this long in timed calls", "100; quick 30"},
          {"no-accuracy", false, "skip the float64 comparison", ""},
          {"seed", true, "input seed", "0"},
          {"list", false, "print the grid and exit", ""},
      },
      "decode.json");
  const Args a(argv, flags);
  if (print_help(a,
                 "usage: fp4attn_bench decode [flags]\n\nTimes paged decode on issue 9's "
                 "grid against the read ceiling of the same run.",
                 flags)) {
    return 0;
  }
  DecodeOptions opt;
  read_suite_flags(a, "decode.json", command, &opt);
  opt.formats = cache_format_list(a, "nvfp4,fp8");
  opt.quick = a.has("quick");
  if (a.has("points")) opt.points = parse_points(a);
  opt.timing.warmup = static_cast<int>(a.get_int("warmup", 3, 0, 1000));
  opt.min_reps = static_cast<int>(a.get_int("reps", 20, 1, 100000));
  opt.min_time_ms = a.get_double("min-time-ms", opt.quick ? 30 : 100, 0, 1e6);
  opt.accuracy = !a.has("no-accuracy");
  opt.seed = static_cast<uint64_t>(a.get_int("seed", 0, 0, INT64_MAX));
  opt.list = a.has("list");
  return run_decode_suite(opt);
}

}  // namespace fp4attn::bench
