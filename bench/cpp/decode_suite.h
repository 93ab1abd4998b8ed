// The "decode" suite of fp4attn_bench: paged_attention_cuda
// (include/fp4attn/paged_attention_cuda.h) on issue 9's grid, with the bytes it reads against a
// read-only ceiling of the same run and its accuracy against float64 on the unquantized tokens.
// bench/decode_peers.py measures the BF16 SDPA peer and merges both into bench/results/decode.json
// (docs/benchmarks.md, "decode").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fp4attn/golden/paged_kv.h"
#include "suites.h"

namespace fp4attn::bench {

struct DecodeOptions : SuiteOptions {
  std::vector<KvCacheFormat> formats{KvCacheFormat::kNvfp4, KvCacheFormat::kFp8};
  bool quick = false;
  std::vector<std::pair<int64_t, int64_t>> points;  // (batch, cached length); empty: the grid
  int64_t h = 32, h_kv = 8, d = 128, s_q = 1, page_size = 16;
  int min_reps = 20;         // timed calls: at least this many ...
  double min_time_ms = 100;  // ... and this much time
  int max_reps = 5000;
  bool accuracy = true;  // cos / rel-L2 of one sequence (all heads) against float64
  uint64_t seed = 0;
};

// issue 9's grid: (32, 4k), (32, 32k), then batch {1, 8, 64, 256} x L {1k, 8k, 32k}; quick: the
// two issue points and (1, 32k), (256, 8k).
std::vector<std::pair<int64_t, int64_t>> decode_grid(bool quick);

int run_decode_suite(const DecodeOptions& opt);

}  // namespace fp4attn::bench
