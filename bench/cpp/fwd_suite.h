// The "fwd" suite of fp4attn_bench: the forward attention engine (include/fp4attn/attention_cuda.h)
// on issue 4's grid, with its accuracy against float64 and the copy ceiling of the same run.
// bench/fwd_peers.py measures the SDPA peers and bench/fwd_record.py merges both into
// bench/results/fwd.json (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp4attn/recipe.h"
#include "suites.h"

namespace fp4attn::bench {

struct FwdOptions : SuiteOptions {
  std::vector<Recipe> recipes{Recipe::kFp8};
  bool quick = false;            // d = 128, s in {4k, 16k}: 4 points
  std::vector<int64_t> dims;     // overrides the head dims of the grid when not empty
  std::vector<int64_t> seqlens;  // overrides the sequence lengths when not empty
  int min_reps = 10;             // timed calls per point: at least this many ...
  double min_time_ms = 200;      // ... and at least this much time in all
  int max_reps = 2000;
  int sample_rows = 256;     // query rows checked against float64 per grid point
  int acc_slices = 32;       // (batch, head) slices of the FA3-shape check; 0 = all
  bool fa3_accuracy = true;  // the accuracy record at b=8, h=16, s=2048, d=128
  uint64_t seed = 0;
  bool bound = false;  // time the no-softmax bound instead of the engine (fwd_bound.h)
};

// Runs the grid and writes the suite's JSON (complete = false until the last point is in).
// Returns the process exit code.
int run_fwd_suite(const FwdOptions& opt);

}  // namespace fp4attn::bench
