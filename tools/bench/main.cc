// fp4attn_bench: GPU benchmark suites writing the JSON of record (docs/benchmarks.md).
//
//   fp4attn_bench quantize [--out FILE] [--sizes 16M,256M,1G,2G] [--quick] [--warmup N] [--reps N]
//                          [--filter TEXT] [--head-dim 64|128] [--revision SHA] [--device N]
//                          [--list]
//   fp4attn_bench fwd [--recipes fp8,...] [--quick] [--json FILE] ...   (fwd_main.cc; --help)
//   fp4attn_bench decode [--recipes nvfp4,fp8] [--quick] [--out FILE] ...   (decode_suite.cc)
//   fp4attn_bench paged-prefill [--recipes nvfp4,fp8] [--out FILE] ...  (paged_prefill_suite.cc)
// The suite may also be named as `--suite NAME` in front.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "options.h"
#include "suites.h"

#ifndef FP4ATTN_BENCH_REVISION
#define FP4ATTN_BENCH_REVISION "unknown"
#endif

namespace {

using fp4attn::bench::QuantizeOptions;

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: fp4attn_bench quantize [options]\n"
      "       fp4attn_bench fwd [options]   (fp4attn_bench fwd --help)\n"
      "       fp4attn_bench decode [options]   (fp4attn_bench decode --help)\n"
      "       fp4attn_bench paged-prefill [options]   (fp4attn_bench paged-prefill --help)\n"
      "       fp4attn_bench bwd [options]   (fp4attn_bench bwd --help)\n"
      "  --out FILE        JSON output (default quantize.json)\n"
      "  --sizes LIST      BF16 input sizes, e.g. 16M,256M,1G,2G (the default)\n"
      "  --quick           16M,256M and fewer repetitions\n"
      "  --warmup N        warm-up samples (default 3)\n"
      "  --reps N          timed samples, median reported (default 20)\n"
      "  --filter TEXT     only cases whose name contains TEXT\n"
      "  --head-dim D      64 or 128 (default 128; h = 2048 / D)\n"
      "  --revision SHA    git revision recorded in the JSON (default: the configure-time one)\n"
      "  --device N        CUDA device (default 0)\n"
      "  --list            print the cases and exit\n");
}

// "16M" -> 16 MiB, "2G" -> 2 GiB, "4096" -> bytes. 0 when malformed.
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

bool parse_sizes(const std::string& list, std::vector<int64_t>* out) {
  out->clear();
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const int64_t v = parse_size(item);
    if (v == 0) return false;
    out->push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !out->empty();
}

std::string shell_quote(const std::string& a) {
  if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=,:+@%") == std::string::npos) {
    return a;
  }
  std::string q = "'";
  for (const char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // `--suite NAME` / `--suite=NAME` in front names the suite too.
  std::string suite = argv[1];
  int first_option = 2;
  if (suite == "--suite" && argc >= 3) {
    suite = argv[2];
    first_option = 3;
  } else if (suite.rfind("--suite=", 0) == 0) {
    suite = suite.substr(8);
  }
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i) command += ' ';
    command += shell_quote(argv[i]);
  }
  if (suite == "fwd") {
    return fp4attn::bench::fwd_main(argc - first_option, argv + first_option, command);
  }
  if (suite == "decode") {
#ifdef FP4ATTN_BENCH_HAVE_DECODE
    return fp4attn::bench::decode_main(argc - first_option, argv + first_option, command);
#else
    std::fprintf(stderr, "fp4attn_bench: the decode suite needs the CUDA library (not built)\n");
    return 2;
#endif
  }
  if (suite == "paged-prefill") {
#ifdef FP4ATTN_BENCH_HAVE_DECODE
    return fp4attn::bench::paged_prefill_main(argc - first_option, argv + first_option, command);
#else
    std::fprintf(stderr, "fp4attn_bench: the paged-prefill suite needs the CUDA library\n");
    return 2;
#endif
  }
  if (suite == "bwd") {
#ifdef FP4ATTN_BENCH_HAVE_DECODE
    return fp4attn::bench::bwd_main(argc - first_option, argv + first_option, command);
#else
    std::fprintf(stderr, "fp4attn_bench: the bwd suite needs the CUDA library (not built)\n");
    return 2;
#endif
  }
  if (suite != "quantize") {
    std::fprintf(stderr, "fp4attn_bench: unknown suite '%s'\n", suite.c_str());
    usage(stderr);
    return 2;
  }

  QuantizeOptions opt;
  opt.out_path = "quantize.json";
  opt.revision = FP4ATTN_BENCH_REVISION;
  parse_sizes("16M,256M,1G,2G", &opt.sizes);
  opt.command = command;

  bool quick = false, sizes_given = false, reps_given = false;
  for (int i = first_option; i < argc; ++i) {
    const std::string a = argv[i];
    std::string key, value;
    const bool has_value = fp4attn::bench::split_option(a, &key, &value);
    auto next = [&](const char* name) -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fp4attn_bench: %s needs a value\n", name);
        return false;
      }
      value = argv[++i];
      return true;
    };
    if (key == "--quick") {
      quick = true;
    } else if (key == "--list") {
      opt.list = true;
    } else if (key == "--out") {
      if (!next("--out")) return 2;
      opt.out_path = value;
    } else if (key == "--sizes") {
      if (!next("--sizes")) return 2;
      if (!parse_sizes(value, &opt.sizes)) {
        std::fprintf(stderr, "fp4attn_bench: bad --sizes '%s' (e.g. 16M,256M,1G)\n", value.c_str());
        return 2;
      }
      sizes_given = true;
    } else if (key == "--warmup" || key == "--reps" || key == "--head-dim" || key == "--device") {
      if (!next(key.c_str())) return 2;
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 0) {
        std::fprintf(stderr, "fp4attn_bench: bad %s '%s'\n", key.c_str(), value.c_str());
        return 2;
      }
      if (key == "--warmup") opt.timing.warmup = static_cast<int>(v);
      if (key == "--reps") opt.timing.reps = static_cast<int>(v), reps_given = true;
      if (key == "--head-dim") opt.head_dim = v;
      if (key == "--device") opt.device = static_cast<int>(v);
    } else if (key == "--filter") {
      if (!next("--filter")) return 2;
      opt.filter = value;
    } else if (key == "--revision") {
      if (!next("--revision")) return 2;
      opt.revision = value;
    } else {
      std::fprintf(stderr, "fp4attn_bench: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (opt.head_dim != 64 && opt.head_dim != 128) {
    std::fprintf(stderr, "fp4attn_bench: --head-dim must be 64 or 128\n");
    return 2;
  }
  if (opt.timing.reps < 1) {
    std::fprintf(stderr, "fp4attn_bench: --reps must be at least 1\n");
    return 2;
  }
  if (quick) {
    if (!sizes_given) parse_sizes("16M,256M", &opt.sizes);
    if (!reps_given) opt.timing.reps = 10;
  }
  return fp4attn::bench::run_quantize_suite(opt);
}
