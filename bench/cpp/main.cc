// fp4attn_bench: GPU benchmark suites writing the JSON of record (docs/benchmarks.md).
//
//   fp4attn_bench quantize [flags]        (quantize_suite.cc)
//   fp4attn_bench fwd [flags]             (fwd_main.cc)
//   fp4attn_bench decode [flags]          (decode_suite.cc)
//   fp4attn_bench paged-prefill [flags]   (paged_prefill_suite.cc)
//   fp4attn_bench bwd [flags]             (bwd_suite.cc)
// `fp4attn_bench SUITE --help` lists a suite's flags. The suite may also be named as
// `--suite NAME` in front.
#include <cstdio>
#include <string>
#include <vector>

#include "suite_args.h"
#include "suites.h"

namespace {

constexpr const char* kUsage =
    "usage: fp4attn_bench <suite> [flags]\n\n"
    "Suites:\n"
    "  quantize       the GPU quantizers against the copy ceiling\n"
    "  fwd            the forward engine on issue 4's grid\n"
    "  decode         paged decode on issue 9's grid\n"
    "  paged-prefill  paged prefill on issue 9's target\n"
    "  bwd            the GPU backward alone on issue 8's grid\n\n"
    "fp4attn_bench <suite> --help shows a suite's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace fp4attn::bench;
  std::vector<std::string> rest(argv + 1, argv + argc);
  if (rest.empty() || rest[0] == "--help" || rest[0] == "-h") {
    std::fprintf(rest.empty() ? stderr : stdout, "%s", kUsage);
    return rest.empty() ? 2 : 0;
  }
  // `--suite NAME` / `--suite=NAME` in front names the suite too.
  std::string suite = rest[0];
  rest.erase(rest.begin());
  if (suite == "--suite" && !rest.empty()) {
    suite = rest[0];
    rest.erase(rest.begin());
  } else if (suite.rfind("--suite=", 0) == 0) {
    suite = suite.substr(8);
  }
  const std::string command =
      fp4attn::cli::command_line(std::vector<std::string>(argv, argv + argc));
  try {
    if (suite == "quantize") return quantize_main(rest, command);
    if (suite == "fwd") return fwd_main(rest, command);
    if (suite == "decode") return decode_main(rest, command);
    if (suite == "paged-prefill") return paged_prefill_main(rest, command);
    if (suite == "bwd") return bwd_main(rest, command);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fp4attn_bench %s: %s\n", suite.c_str(), e.what());
    return 2;
  }
  std::fprintf(stderr,
               "fp4attn_bench: unknown suite '%s' (quantize, fwd, decode, paged-prefill, bwd)\n",
               suite.c_str());
  return 2;
}
