// The suites of fp4attn_bench and the options they share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "timing.h"

namespace fp4attn::bench {

struct SuiteOptions {
  std::string out_path;  // the suite's JSON
  std::string revision;  // git revision of the code measured
  std::string command;   // the exact command line, recorded in the JSON
  TimingConfig timing;
  std::string filter;  // run only the cases whose name contains this
  bool list = false;   // print the cases and exit
  int device = 0;
};

struct QuantizeOptions : SuiteOptions {
  std::vector<int64_t> sizes;  // BF16 input bytes per call
  int64_t hidden = 2048;       // h * d of the BSHD input
  int64_t head_dim = 128;
  int64_t max_seqlen = 16384;  // s = min(tokens, max_seqlen), b = tokens / s
};

// Times every GPU quantizer at each size and the copy ceiling in the same run; writes the
// "quantize" suite JSON. Returns the process exit code.
int run_quantize_suite(const QuantizeOptions& opt);

// `fp4attn_bench SUITE ...`: argv holds the flags after the suite's name, command the whole
// command line (recorded in the JSON). Each returns the process exit code and throws UsageError
// (suite_args.h) for bad usage.
int quantize_main(const std::vector<std::string>& argv, const std::string& command);
int fwd_main(const std::vector<std::string>& argv, const std::string& command);  // fwd_main.cc
int decode_main(const std::vector<std::string>& argv, const std::string& command);
int paged_prefill_main(const std::vector<std::string>& argv, const std::string& command);
int bwd_main(const std::vector<std::string>& argv, const std::string& command);

}  // namespace fp4attn::bench
