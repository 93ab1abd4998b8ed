// The "paged-prefill" suite of fp4attn_bench: paged_prefill_cuda (include/fp4attn/
// paged_prefill_cuda.h) on issue 9's prefill target: b = 8 sequences, a chunk of 2048 query
// tokens each over L = 8k and 32k cached tokens (seq_len = L, the chunk's own K/V included),
// h = 32 over h_kv = 8, d = 128, causal bottom-right, page size 16, NVFP4 and FP8 caches.
// Per point and format: the cache is written by paged_kv_append_cuda (N(0, 1) BF16 tokens,
// globals calibrated by the first append, shuffled page ids); then timed with CUDA events
// (warm-up, median) in a preallocated workspace: the whole call (repack + Q quantize + engine),
// the repack alone and the engine alone (attention_forward_operands_cuda on the operands the
// call left in the workspace). Caches smaller than 4x the L2 rotate over copies (slots). FLOPs:
// 4 * h * d * (visible (query, key) pairs). Accuracy: the last 64 query rows of the last
// sequence, every head, against float64 attention on its unquantized BF16 tokens.
// bench/paged_prefill_peers.py measures the BF16 SDPA peer and merges both into
// bench/results/paged_prefill.json (docs/benchmarks.md, "paged-prefill").
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

#include "fp4attn/attention_cuda.h"
#include "fp4attn/paged_kv_cuda.h"
#include "fp4attn/paged_prefill_cuda.h"
#include "fwd_device.h"
#include "harness/metrics.h"
#include "record.h"
#include "suite_args.h"
#include "suites.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

constexpr int64_t kAccRows = 64;

struct PrefillOptions : SuiteOptions {
  std::vector<KvCacheFormat> formats{KvCacheFormat::kNvfp4, KvCacheFormat::kFp8};
  std::vector<int64_t> lens{8192, 32768};
  int64_t b = 8, chunk = 2048, h = 32, h_kv = 8, d = 128, page_size = 16;
  int min_reps = 10;
  double min_time_ms = 200;
  bool accuracy = true;
  uint64_t seed = 0;
};

struct Record {
  KvCacheFormat format;
  int64_t len = 0, slots = 0;
  double flops = 0;
  Timing whole, repack, engine;
  ErrorStats acc;
  bool have_acc = false;
  std::string error;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Timing time_adaptive(const std::function<void(int)>& call, int slots, const PrefillOptions& o,
                     cudaStream_t stream) {
  const Timing est = time_launches(call, slots, {o.timing.warmup, 3}, stream);
  int reps = o.min_reps;
  if (est.median_ms > 0) {
    reps = std::max(reps, static_cast<int>(std::ceil(o.min_time_ms / (est.median_ms * slots))));
  }
  return time_launches(call, slots, {1, std::clamp(reps, 1, 1000)}, stream);
}

// float64 attention of rows [nq - kAccRows, nq) of the last sequence over its unquantized
// tokens k, v [L, h_kv, d]; q rows [nq, h, d] of that sequence. Out [kAccRows, h, d].
std::vector<double> reference(const PrefillOptions& o, int64_t len, const std::vector<uint16_t>& q,
                              const std::vector<uint16_t>& k, const std::vector<uint16_t>& v) {
  const int64_t h = o.h, d = o.d, group = o.h / o.h_kv, nq = o.chunk;
  std::vector<double> out(kAccRows * h * d, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto work = [&](int64_t hq) {
    const int64_t hk = hq / group;
    std::vector<double> s(len);
    for (int64_t r = 0; r < kAccRows; ++r) {
      const int64_t i = nq - kAccRows + r, vis = i + len - nq + 1;
      double m = -1e300;
      for (int64_t j = 0; j < vis; ++j) {
        double acc = 0;
        for (int64_t e = 0; e < d; ++e)
          acc += bf16(q[(i * h + hq) * d + e]) * bf16(k[(j * o.h_kv + hk) * d + e]);
        s[j] = acc * scale;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < vis; ++j) sum += (s[j] = std::exp(s[j] - m));
      double* dst = &out[(r * h + hq) * d];
      for (int64_t j = 0; j < vis; ++j) {
        const double w = s[j] / sum;
        for (int64_t e = 0; e < d; ++e) dst[e] += w * bf16(v[(j * o.h_kv + hk) * d + e]);
      }
    }
  };
  std::vector<std::thread> pool;
  const int64_t nt = std::max<int64_t>(1, std::thread::hardware_concurrency());
  for (int64_t t = 0; t < nt; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t hq = t; hq < h; hq += nt) work(hq);
    });
  }
  for (auto& th : pool) th.join();
  return out;
}

void run_point(const PrefillOptions& o, int64_t len, KvCacheFormat format, const DeviceInfo& dev,
               cudaStream_t stream, Record* rec) {
  const bool fp4 = format == KvCacheFormat::kNvfp4;
  const int64_t b = o.b, nq = o.chunk, h = o.h, hk = o.h_kv, d = o.d, ps = o.page_size;
  const int64_t max_pages = ceil_div(len, ps), pages = b * max_pages;
  const int64_t row_data = fp4 ? d / 2 : d, row_scales = fp4 ? d / 16 : 0;
  const int64_t page_data = ps * hk * row_data, page_scales = ps * hk * row_scales;
  const size_t cache_bytes = static_cast<size_t>(2 * pages * (page_data + page_scales));
  const int slots = rotation_slots(cache_bytes, dev.l2_bytes, 16);
  rec->slots = slots;
  const int64_t total_pages = pages * slots;
  DeviceBuffer kd(total_pages * page_data), vd(total_pages * page_data);
  DeviceBuffer ks(std::max<int64_t>(total_pages * page_scales, 16)),
      vs(std::max<int64_t>(total_pages * page_scales, 16)), g(8);
  PagedKvCache cache;
  cache.format = format;
  cache.k_data = make_view(kd.get(), DType::kU8, {total_pages, ps, hk, row_data});
  cache.v_data = make_view(vd.get(), DType::kU8, {total_pages, ps, hk, row_data});
  if (fp4) {
    cache.k_scales = make_view(ks.get(), DType::kU8, {total_pages, ps, hk, row_scales});
    cache.v_scales = make_view(vs.get(), DType::kU8, {total_pages, ps, hk, row_scales});
  }
  cache.k_global = make_view(g.get(), DType::kF32, {1});
  cache.v_global = make_view(g.bytes() + 4, DType::kF32, {1});
  // Page tables: slot r uses pages r * pages + (a shuffle of 0 .. pages - 1).
  std::vector<int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<uint32_t>(o.seed + len)));
  std::vector<std::vector<int32_t>> tables(slots, std::vector<int32_t>(b * max_pages));
  for (int r = 0; r < slots; ++r) {
    for (int64_t i = 0; i < pages; ++i) tables[r][i] = static_cast<int32_t>(r * pages + ids[i]);
  }
  std::vector<DeviceBuffer> tables_dev;
  for (int r = 0; r < slots; ++r) {
    tables_dev.emplace_back(static_cast<size_t>(b * max_pages * 4));
    BENCH_CUDA(cudaMemcpy(tables_dev[r].get(), tables[r].data(), b * max_pages * 4,
                          cudaMemcpyHostToDevice));
  }
  // Tokens, appended in chunks of one sequence (slot 0), the last sequence's kept on the host.
  const int64_t row = hk * d;
  DeviceBuffer kb(len * row * 2), vb(len * row * 2), slot_dev(len * 4);
  std::vector<int32_t> slot_map(len);
  std::vector<uint16_t> k_last(len * row), v_last(len * row);
  BENCH_CUDA(cudaMemsetAsync(g.get(), 0, 8, stream));
  for (int64_t bi = 0; bi < b; ++bi) {
    fill_normal_bf16(kb.get(), len * row, o.seed * 1000003 + 2 * bi, stream);
    fill_normal_bf16(vb.get(), len * row, o.seed * 1000003 + 2 * bi + 1, stream);
    for (int64_t j = 0; j < len; ++j) {
      slot_map[j] =
          static_cast<int32_t>(paged_kv_slot(tables[0][bi * max_pages + j / ps], ps, j % ps));
    }
    BENCH_CUDA(
        cudaMemcpyAsync(slot_dev.get(), slot_map.data(), len * 4, cudaMemcpyHostToDevice, stream));
    const Status st = paged_kv_append_cuda(make_view(kb.get(), DType::kBF16, {len, hk, d}),
                                           make_view(vb.get(), DType::kBF16, {len, hk, d}),
                                           make_view(slot_dev.get(), DType::kI32, {len}), cache,
                                           PagedAppendCudaOptions{}, stream);
    if (!st.ok()) {
      rec->error = "append: " + st.message();
      return;
    }
    if (bi == b - 1) {
      BENCH_CUDA(
          cudaMemcpyAsync(k_last.data(), kb.get(), len * row * 2, cudaMemcpyDeviceToHost, stream));
      BENCH_CUDA(
          cudaMemcpyAsync(v_last.data(), vb.get(), len * row * 2, cudaMemcpyDeviceToHost, stream));
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }
  for (int r = 1; r < slots; ++r) {  // copies of slot 0's pages
    for (DeviceBuffer* buf : {&kd, &vd}) {
      BENCH_CUDA(cudaMemcpy(buf->bytes() + r * pages * page_data, buf->get(), pages * page_data,
                            cudaMemcpyDeviceToDevice));
    }
    if (fp4) {
      for (DeviceBuffer* buf : {&ks, &vs}) {
        BENCH_CUDA(cudaMemcpy(buf->bytes() + r * pages * page_scales, buf->get(),
                              pages * page_scales, cudaMemcpyDeviceToDevice));
      }
    }
  }
  // Queries, outputs, indices, workspace.
  const int64_t tq = b * nq;
  DeviceBuffer q(tq * h * d * 2), out(tq * h * d * 2), lse(h * tq * 4);
  fill_normal_bf16(q.get(), tq * h * d, o.seed * 7919 + 17, stream);
  std::vector<int32_t> lens(b, static_cast<int32_t>(len)), cu(b + 1);
  for (int64_t i = 0; i <= b; ++i) cu[i] = static_cast<int32_t>(i * nq);
  DeviceBuffer lens_dev(b * 4), cu_dev((b + 1) * 4);
  BENCH_CUDA(cudaMemcpy(lens_dev.get(), lens.data(), b * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(cu_dev.get(), cu.data(), (b + 1) * 4, cudaMemcpyHostToDevice));
  const TensorView lens_h = make_view(lens.data(), DType::kI32, {b});
  const TensorView cu_h = make_view(cu.data(), DType::kI32, {b + 1});
  PagedPrefillLayout lay;
  Status st = paged_prefill_layout(cu_h, lens_h, h, hk, d, &lay);
  if (!st.ok()) {
    rec->error = st.message();
    return;
  }
  DeviceBuffer ws(static_cast<size_t>(lay.bytes));
  PagedPrefillCudaOptions copt;
  copt.seq_lens_host = lens_h;
  copt.cu_seqlens_q_host = cu_h;
  copt.workspace = ws.get();
  copt.workspace_bytes = static_cast<size_t>(lay.bytes);
  const TensorView qv = make_view(q.get(), DType::kBF16, {tq, h, d});
  const TensorView ov = make_view(out.get(), DType::kBF16, {tq, h, d});
  const TensorView lv = make_view(lse.get(), DType::kF32, {h, tq});
  auto bt = [&](int r) { return make_view(tables_dev[r].get(), DType::kI32, {b, max_pages}); };
  auto bt_host = [&](int r) { return make_view(tables[r].data(), DType::kI32, {b, max_pages}); };
  Status call_status;
  auto whole = [&](int r) {
    PagedPrefillCudaOptions c = copt;
    c.block_tables_host = bt_host(r);
    const Status s = paged_prefill_cuda(qv, make_view(cu_dev.get(), DType::kI32, {b + 1}), cache,
                                        bt(r), make_view(lens_dev.get(), DType::kI32, {b}),
                                        PagedAttentionOptions{}, ov, lv, c, stream);
    if (!s.ok()) call_status = s;
  };
  whole(0);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  if (!call_status.ok()) {
    rec->error = call_status.message();
    return;
  }
  rec->whole = time_adaptive(whole, slots, o, stream);
  rec->repack = time_adaptive(
      [&](int r) {
        const Status s = paged_prefill_repack_cuda(cache, bt(r), bt_host(r), lay, ws.get(), stream);
        if (!s.ok()) call_status = s;
      },
      slots, o, stream);
  const ForwardOperands in = paged_prefill_operands(lay, ws.get(), 0, b);
  ForwardOptions fopt;
  fopt.recipe = copt.q_recipe;
  fopt.causal = true;
  const TensorView o4 = make_view(out.get(), DType::kBF16, {b, nq, h, d});
  const TensorView l4 = make_strided_view(lse.get(), DType::kF32, {b, h, nq}, {nq, tq, 1});
  rec->engine = time_adaptive(
      [&](int) {
        const Status s = attention_forward_operands_cuda(in, fopt, o4, l4, stream);
        if (!s.ok()) call_status = s;
      },
      1, o, stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  if (!call_status.ok()) {
    rec->error = call_status.message();
    return;
  }
  rec->flops = 4.0 * h * d * b * (double(nq) * (len - nq) + double(nq) * (nq + 1) / 2);
  if (o.accuracy) {
    BENCH_CUDA(cudaMemset(out.get(), 0xFF, tq * h * d * 2));
    whole(0);
    BENCH_CUDA(cudaStreamSynchronize(stream));
    std::vector<uint16_t> q_last(nq * h * d), o_rows(kAccRows * h * d);
    BENCH_CUDA(cudaMemcpy(q_last.data(), q.bytes() + (b - 1) * nq * h * d * 2, nq * h * d * 2,
                          cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(o_rows.data(), out.bytes() + ((b - 1) * nq + nq - kAccRows) * h * d * 2,
                          kAccRows * h * d * 2, cudaMemcpyDeviceToHost));
    const std::vector<double> ref = reference(o, len, q_last, k_last, v_last);
    std::vector<double> got(o_rows.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16(o_rows[i]);
    rec->acc = compare(got.data(), ref.data(), static_cast<int64_t>(got.size()));
    rec->have_acc = true;
  }
}

std::string record_json(const PrefillOptions& o, const Record& r) {
  // Built by appends: GCC 12's -Wrestrict misfires on `"literal" + std::string`.
  std::string name = "b";
  name += std::to_string(o.b);
  name += "-c";
  name += std::to_string(o.chunk);
  name += "-L";
  name += std::to_string(r.len);
  JsonObject j;
  j.str("case", name)
      .str("recipe", kv_cache_format_name(r.format))
      .integer("b", o.b)
      .integer("h", o.h)
      .integer("h_kv", o.h_kv)
      .integer("s_q", o.chunk)
      .integer("s_k", r.len)
      .integer("d", o.d)
      .integer("page_size", o.page_size)
      .boolean("causal", true);
  if (!r.error.empty()) return j.str("error", r.error).render();
  j.num("ms", r.whole.median_ms, 5)
      .num("ms_min", r.whole.min_ms, 5)
      .num("tflops", r.flops / r.whole.median_ms / 1e9, 5)
      .num("repack_ms", r.repack.median_ms, 5)
      .num("engine_ms", r.engine.median_ms, 5)
      .num("engine_tflops", r.flops / r.engine.median_ms / 1e9, 5)
      .num("flops", r.flops, 6)
      .integer("reps", r.whole.samples)
      .integer("slots", r.slots);
  if (r.have_acc) {
    j.num("cos", r.acc.cos, 8)
        .num("rel_l2", r.acc.rel_l2, 5)
        .num("max_abs", r.acc.max_abs, 4)
        .integer("nan_mismatch", r.acc.nan_mismatch);
  }
  return j.render();
}

bool write_json(const PrefillOptions& o, const DeviceInfo& dev, const std::string& date,
                const std::vector<Record>& recs, bool complete) {
  std::vector<std::string> lines;
  for (const auto& r : recs) lines.push_back(record_json(o, r));
  JsonObject doc = record_header("paged-prefill", true, o, dev.name, date);
  doc.boolean("complete", complete)
      .raw("config",
           JsonObject()
               .integer("sms", dev.sms)
               .str("inputs",
                    "k, v, q N(0, 1) BF16 (GPU); cache written by paged_kv_append_cuda "
                    "(calibrated globals), shuffled page ids; seq_len = s_k includes the chunk")
               .str("timing",
                    "CUDA events, median; ms = paged_prefill_cuda (repack + Q quantize + engine, "
                    "preallocated workspace), repack_ms and engine_ms alone; caches under 4x the "
                    "L2 rotate over copies (slots)")
               .str("flops", "4 h d x visible (query, key) pairs, causal bottom-right")
               .str("accuracy",
                    "last 64 query rows of the last sequence, every head, vs float64 attention "
                    "on the unquantized BF16 tokens")
               .render())
      .raw("records", json_array_lines(lines));
  return write_record(o, doc);
}

}  // namespace

int paged_prefill_main(const std::vector<std::string>& argv, const std::string& command) {
  const std::vector<FlagSpec> flags = suite_flags(
      {
          {"recipes", true, "cache formats", "nvfp4,fp8"},
          {"lens", true, "cached tokens per sequence (the chunk included)", "8192,32768"},
          {"chunk", true, "query tokens per sequence", "2048"},
          {"batch", true, "sequences", "8"},
          {"quick", false, "shorter timing (at least 3 calls and 50 ms per point)", ""},
          {"no-accuracy", false, "skip the float64 comparison", ""},
      },
      "paged_prefill.json");
  const Args a(argv, flags);
  if (print_help(a,
                 "usage: fp4attn_bench paged-prefill [flags]\n\nTimes paged prefill (a "
                 "chunk over a paged cache) on issue 9's target.",
                 flags)) {
    return 0;
  }
  PrefillOptions o;
  read_suite_flags(a, "paged_prefill.json", command, &o);
  o.formats = cache_format_list(a, "nvfp4,fp8");
  o.lens = a.get_int_list("lens", "8192,32768", 1, int64_t{1} << 24);
  o.chunk = a.get_int("chunk", 2048, 1, 1 << 20);
  o.b = a.get_int("batch", 8, 1, 1 << 16);
  if (a.has("quick")) {
    o.min_time_ms = 50;
    o.min_reps = 3;
  }
  o.accuracy = !a.has("no-accuracy");
  for (int64_t l : o.lens) {
    if (l < o.chunk || l % o.page_size != 0) {
      throw UsageError("--lens: expected lengths >= --chunk and multiples of 16, got " +
                       std::to_string(l));
    }
  }
  BENCH_CUDA(cudaSetDevice(o.device));
  const DeviceInfo dev = device_info(o.device);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::string date = utc_now_iso();
  std::vector<Record> recs;
  std::printf("paged-prefill suite on %s: b=%lld chunk=%lld h=%lld/%lld d=%lld\n", dev.name.c_str(),
              static_cast<long long>(o.b), static_cast<long long>(o.chunk),
              static_cast<long long>(o.h), static_cast<long long>(o.h_kv),
              static_cast<long long>(o.d));
  std::printf("%-8s %-6s %9s %8s %9s %9s %8s %9s %8s\n", "L", "format", "ms", "TFLOP/s", "repack",
              "engine", "eng TF/s", "cos", "rel_l2");
  int failed = 0;
  for (int64_t len : o.lens) {
    for (KvCacheFormat f : o.formats) {
      Record r;
      r.format = f;
      r.len = len;
      run_point(o, len, f, dev, stream, &r);
      if (!r.error.empty()) {
        ++failed;
        std::printf("%-8lld %-6s error: %s\n", static_cast<long long>(len), kv_cache_format_name(f),
                    r.error.c_str());
      } else {
        std::printf("%-8lld %-6s %9.4f %8.1f %9.4f %9.4f %8.1f %9.6f %8.5f\n",
                    static_cast<long long>(len), kv_cache_format_name(f), r.whole.median_ms,
                    r.flops / r.whole.median_ms / 1e9, r.repack.median_ms, r.engine.median_ms,
                    r.flops / r.engine.median_ms / 1e9, r.acc.cos, r.acc.rel_l2);
      }
      recs.push_back(r);
      write_json(o, dev, date, recs, false);
    }
  }
  const bool written = write_json(o, dev, date, recs, failed == 0);
  std::printf("wrote %s\n", o.out_path.c_str());
  cudaStreamDestroy(stream);
  return failed || !written ? 1 : 0;
}

}  // namespace fp4attn::bench
