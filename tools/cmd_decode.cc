// `fp4attn decode`: decode (or speculative decode) over a paged NVFP4 / FP8 KV cache built from
// the standard suite's seeded inputs (fp4attn/suite.h) through a shuffled page table; the golden
// model on the CPU or the decode kernel on the GPU; accuracy against float64 attention of the
// unquantized tokens, time and the cache bytes read per second.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_inputs.h"
#include "cli_output.h"
#include "commands.h"
#include "core/half.h"
#include "core/parallel.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/golden/reference.h"
#include "gpu/decode_gpu.h"
#include "harness/metrics.h"
#include "harness/paged_host_cache.h"
#include "harness/suite.h"

namespace fp4attn::cli {
namespace {

const std::vector<FlagSpec> kDecodeFlags = {
    {"batch", true, "sequences", "4"},
    {"heads", true, "query heads", "32"},
    {"kv-heads", true, "key/value heads (GQA when fewer than --heads)", "8"},
    {"context", true, "cached tokens per sequence (the query tokens included)", "4096"},
    {"query-tokens", true, "query tokens per sequence (1 decode, more: speculative)", "1"},
    {"head-dim", true, "64 or 128", "128"},
    {"page-size", true, "tokens per page", "16"},
    {"format", true, "nvfp4, fp8 or 'all'", "all"},
    {"input", true, "gaussian, outliers, large-logits, near-uniform or 'all' (fp4attn/suite.h)",
     "gaussian"},
    {"backend", true,
     "'auto' (the GPU kernel where it runs, else the golden model), 'gpu' or 'cpu'", "auto"},
    {"seed", true, "input seed", "0"},
    json_flag(),
    quiet_flag(),
    {"help", false, "show this help", ""},
};

struct Shape {
  int64_t b, h, h_kv, len, s_q, d, page_size;
};

// Pages per sequence and in the cache (one spare page), as cmd_decode lays them out.
int64_t pages_per_seq(const Shape& s) { return (s.len + s.page_size - 1) / s.page_size; }
int64_t cache_pages(const Shape& s) { return s.b * pages_per_seq(s) + 1; }

// Every buffer of the command is sized from the flags: refuse what overflows or does not fit in
// memory before allocating (issue 26). Flag ranges keep each product below 2^62 here; the
// checked arithmetic is what says so.
void check_sizes(const Shape& s) {
  const char* flags = "--batch, --context, --page-size";
  // Slots (page * page_size + offset) and page ids are int32 in the cache's API.
  const int64_t slots =
      flag_product("cache slots", {{"pages", cache_pages(s)}, {"--page-size", s.page_size}});
  if (slots > INT32_MAX) {
    throw UsageError(std::string(flags) + ": " + std::to_string(s.b) + " sequences of " +
                     std::to_string(s.len) + " tokens in pages of " + std::to_string(s.page_size) +
                     " need " + std::to_string(slots) +
                     " cache slots, more than int32 slot indices address (2147483647)");
  }
  const int64_t tokens = flag_product("tokens", {{"--batch", s.b}, {"--context", s.len}});
  const int64_t kv =
      flag_product("k elements", {{"tokens", tokens}, {"--kv-heads", s.h_kv}, {"--head-dim", s.d}});
  const int64_t nq = flag_product(
      "q elements",
      {{"--batch", s.b}, {"--query-tokens", s.s_q}, {"--heads", s.h}, {"--head-dim", s.d}});
  const int64_t cache = flag_product(
      "cache values", {{"cache slots", slots}, {"--kv-heads", s.h_kv}, {"--head-dim", s.d}});
  // The suite's k, v and their BF16-exact copies (float32), q and its copy; the exact, golden
  // and GPU outputs (float64); slots, the page table and its permutation (int32); one format's
  // cache (FP8's is the larger); per thread, one sequence's decoded K and V (float64).
  check_host_buffers(std::string(flags) + ", --heads, --kv-heads, --head-dim",
                     {{kv, 16},
                      {nq, 8},
                      {nq, 24},
                      {tokens, 4},
                      {s.b * (pages_per_seq(s) + 1), 4},
                      {cache_pages(s), 4},
                      {cache, 2},
                      {s.len * (2 * s.d + 1), 8 * int64_t(num_threads())}});
}

Shape parse_shape(const Args& a) {
  Shape s{};
  s.b = a.get_int("batch", 4, 1, 1 << 16);
  s.h = a.get_int("heads", 32, 1, 4096);
  s.h_kv = a.get_int("kv-heads", 8, 1, 4096);
  s.len = a.get_int("context", 4096, 1, int64_t(1) << 24);
  s.s_q = a.get_int("query-tokens", 1, 1, 64);
  s.d = a.get_int("head-dim", 128, 1, 4096);
  s.page_size = a.get_int("page-size", 16, 1, 1 << 16);
  if (s.d != 64 && s.d != 128) {
    throw UsageError("--head-dim: expected 64 or 128, got " + std::to_string(s.d));
  }
  if (s.h % s.h_kv != 0) {
    throw UsageError("--heads: " + std::to_string(s.h) + " is not a multiple of --kv-heads " +
                     std::to_string(s.h_kv));
  }
  if (s.s_q > s.len) {
    throw UsageError("--query-tokens: " + std::to_string(s.s_q) + " is more than --context " +
                     std::to_string(s.len) + " (the queries are the last cached tokens)");
  }
  check_sizes(s);
  return s;
}

std::vector<KvCacheFormat> parse_formats(const Args& a) {
  const std::string f = a.get("format", "all");
  if (f == "all") return {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8};
  if (f == "nvfp4") return {KvCacheFormat::kNvfp4};
  if (f == "fp8") return {KvCacheFormat::kFp8};
  throw UsageError("--format: expected nvfp4, fp8 or all, got '" + f + "'");
}

// One row of the table and of --json.
struct DecodeRow {
  std::string input, format;
  double cache_mb, ms, gbps;  // gbps: NaN on the golden model (its time is not a bandwidth)
  ErrorStats vs_f64;
  double vs_golden_rel_l2;  // the GPU output against the golden model; NaN without the GPU
};

void write_json(const Args& a, const std::vector<std::string>& argv, const Shape& s, bool gpu,
                const std::vector<DecodeRow>& rows) {
  std::vector<std::string> records;
  for (const DecodeRow& r : rows) {
    JsonObject j;
    j.str("input", r.input).str("format", r.format).str("backend", gpu ? "gpu" : "cpu-golden");
    j.integer("b", s.b).integer("h", s.h).integer("h_kv", s.h_kv).integer("context", s.len);
    j.integer("query_tokens", s.s_q).integer("d", s.d).integer("page_size", s.page_size);
    j.num("cache_mb", r.cache_mb, 7).num("ms", r.ms, 6).num("gbps", r.gbps, 5);
    j.num("cos", r.vs_f64.cos, 7).num("rel_l2", r.vs_f64.rel_l2, 7);
    j.num("max_abs", r.vs_f64.max_abs, 7).num("vs_golden_rel_l2", r.vs_golden_rel_l2, 7);
    records.push_back(j.render());
  }
  JsonObject doc = cli_document("decode", "decode", argv, RanOn{.cpu = !gpu, .gpu = gpu});
  write_cli_json(a, doc.raw("records", json_array_lines(records)));
}

// The suite's values are BF16-exact (what a BF16 model hands the cache).
std::vector<float> bf16_exact(std::vector<float> x) {
  for (float& v : x) v = bf16_bits_to_float(float_to_bf16_bits(v));
  return x;
}

}  // namespace

int cmd_decode(const std::vector<std::string>& argv) {
  const Args a(argv, kDecodeFlags);
  if (a.has("help")) {
    std::printf("%s",
                format_help("usage: fp4attn decode [flags]\n\n"
                            "Decode over a paged NVFP4/FP8 KV cache (docs/kernels/decode.md): "
                            "accuracy against float64 of the unquantized tokens, and time: one "
                            "row per input and format, each announced on stderr as [i/N] "
                            "(--quiet: not).",
                            kDecodeFlags)
                    .c_str());
    return 0;
  }
  const Shape s = parse_shape(a);
  const std::vector<KvCacheFormat> formats = parse_formats(a);
  const std::vector<InputKind> inputs = parse_input_kinds(a);
  const std::string backend = a.get("backend", "auto");
  if (backend != "auto" && backend != "gpu" && backend != "cpu") {
    throw UsageError("--backend: expected auto, gpu or cpu, got '" + backend + "'");
  }
  const std::string why_not_gpu = backend == "cpu" ? "" : decode_gpu_unavailable_reason();
  if (backend == "gpu" && !why_not_gpu.empty()) {
    std::fprintf(stderr, "fp4attn decode: --backend gpu: %s\n", why_not_gpu.c_str());
    return 1;
  }
  const bool gpu = backend != "cpu" && why_not_gpu.empty();
  const uint32_t seed = static_cast<uint32_t>(a.get_int("seed", 0, 0, 0xFFFFFFFFll));
  check_json_path(a);

  // Page table and slots (the same for every input).
  const int64_t tokens = s.b * s.len;
  const int64_t num_pages = cache_pages(s);
  const paged_host::PageTable pt = paged_host::random_pages(
      std::vector<int32_t>(s.b, static_cast<int32_t>(s.len)), s.page_size, num_pages, seed);
  std::vector<int32_t> slots(tokens);
  for (int64_t bi = 0; bi < s.b; ++bi) {
    for (int64_t j = 0; j < s.len; ++j) slots[bi * s.len + j] = pt.slot(bi, j);
  }
  std::vector<int32_t> table = pt.table, lens = pt.lens;
  const TensorView tbt = make_view(table.data(), DType::kI32, {s.b, pt.max_pages});
  const TensorView tlen = make_view(lens.data(), DType::kI32, {s.b});
  PagedAttentionOptions opt;  // causal bottom-right: the queries are the last cached tokens

  std::printf(
      "decode: b=%lld, %lld/%lld heads, context %lld, %lld query token(s), d=%lld, "
      "page size %lld, backend %s%s\n",
      (long long)s.b, (long long)s.h, (long long)s.h_kv, (long long)s.len, (long long)s.s_q,
      (long long)s.d, (long long)s.page_size, gpu ? "gpu" : "cpu (golden model)",
      (!gpu && backend == "auto") ? (" — GPU: " + why_not_gpu).c_str() : "");
  std::printf("%-13s %-6s %10s %10s %9s %10s %10s %12s\n", "input", "format", "cache MB", "ms",
              "GB/s", "cos", "rel_l2", "vs golden");
  std::vector<DecodeRow> rows;
  Progress progress = cli_progress(a, static_cast<int64_t>(inputs.size() * formats.size()));
  for (InputKind kind : inputs) {
    // The suite's tokens; the queries are the last s_q tokens of each sequence.
    const SuiteInputs in = make_inputs(kind, s.b, s.s_q, s.len, s.h, s.h_kv, s.d, seed);
    std::vector<float> k = bf16_exact(in.k), v = bf16_exact(in.v), q = bf16_exact(in.q);
    const TensorView tq = make_view(q.data(), DType::kF32, {s.b, s.s_q, s.h, s.d});

    // float64 attention over the unquantized tokens.
    std::vector<double> exact(s.b * s.s_q * s.h * s.d);
    {
      AttentionOptions ao;
      ao.causal = true;
      const Status st = reference_attention_forward(
          tq, make_view(k.data(), DType::kF32, {s.b, s.len, s.h_kv, s.d}),
          make_view(v.data(), DType::kF32, {s.b, s.len, s.h_kv, s.d}), ao,
          make_view(exact.data(), DType::kF64, {s.b, s.s_q, s.h, s.d}), TensorView{});
      if (!st.ok()) {
        std::fprintf(stderr, "fp4attn decode: reference: %s\n", st.message().c_str());
        return 1;
      }
    }

    for (KvCacheFormat f : formats) {
      progress.next(std::string("input ") + input_kind_name(kind) + ", format " +
                    kv_cache_format_name(f));
      paged_host::OwnedCache cache(f, num_pages, s.page_size, s.h_kv, s.d);
      const PagedKvCache view = cache.view();
      Status st = paged_kv_append(make_view(k.data(), DType::kF32, {tokens, s.h_kv, s.d}),
                                  make_view(v.data(), DType::kF32, {tokens, s.h_kv, s.d}),
                                  make_view(slots.data(), DType::kI32, {tokens}), view);
      std::vector<double> golden(exact.size()), out(exact.size());
      const TensorView tgold = make_view(golden.data(), DType::kF64, {s.b, s.s_q, s.h, s.d});
      double ms = 0;
      if (st.ok()) {
        const auto t0 = std::chrono::steady_clock::now();
        st = golden_paged_attention(tq, TensorView{}, view, tbt, tlen, opt, tgold, TensorView{});
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count();
      }
      if (st.ok() && gpu) {
        st = run_decode_gpu(view, tq, tbt, tlen, opt,
                            make_view(out.data(), DType::kF64, {s.b, s.s_q, s.h, s.d}), &ms);
      }
      if (!st.ok()) {
        std::fprintf(stderr, "fp4attn decode: %s: %s\n", kv_cache_format_name(f),
                     st.message().c_str());
        return 1;
      }
      // Bytes the call must read: every cached token's K and V data and scales.
      const double per_value = f == KvCacheFormat::kNvfp4 ? 0.5 + 1.0 / 16 : 1.0;
      const double mb = double(tokens) * s.h_kv * s.d * 2 * per_value / 1e6;
      const std::vector<double>& result = gpu ? out : golden;
      DecodeRow row{input_kind_name(kind),
                    kv_cache_format_name(f),
                    mb,
                    ms,
                    gpu ? mb / ms : NAN,
                    compare(result.data(), exact.data(), int64_t(exact.size())),
                    NAN};
      std::string vs_golden = "-";
      char gbps[32] = "-";  // the golden model's time is not a bandwidth
      if (gpu) {
        row.vs_golden_rel_l2 = compare(out.data(), golden.data(), int64_t(out.size())).rel_l2;
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3g", row.vs_golden_rel_l2);
        vs_golden = buf;
        std::snprintf(gbps, sizeof gbps, "%.1f", row.gbps);
      }
      std::printf("%-13s %-6s %10.2f %10.4f %9s %10.6f %10.5f %12s\n", row.input.c_str(),
                  row.format.c_str(), mb, ms, gbps, row.vs_f64.cos, row.vs_f64.rel_l2,
                  vs_golden.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  std::printf(
      "cos / rel_l2: against float64 attention of the unquantized tokens; vs golden: "
      "rel-L2 of the GPU output against the golden model on the same cache bytes\n");
  if (a.has("json")) write_json(a, argv, s, gpu, rows);
  return 0;
}

}  // namespace fp4attn::cli
