// What the fwd suite measured (fwd_suite.cc) and how it is written: the suite's JSON (rewritten
// after every point) and the console lines.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fp4attn/recipe.h"
#include "fwd_grid.h"
#include "fwd_suite.h"
#include "harness/metrics.h"
#include "timing.h"

namespace fp4attn::bench {

// One recipe at one grid point.
struct FwdRecord {
  FwdPoint p;
  Recipe recipe = Recipe::kFp8;
  std::string error;
  double quant_ms[3] = {0, 0, 0};  // Q, K, V
  Timing t;
  double sm_mhz = 0;
  ErrorStats acc;
  int64_t acc_rows = 0, acc_batch = 0, acc_head = 0;
};

// One recipe at the FA3 comparison shape.
struct AccuracyRecord {
  FwdPoint p;
  Recipe recipe = Recipe::kFp8;
  std::string error;
  Timing t;
  ErrorStats acc;        // over every compared slice together
  double worst_cos = 1;  // of the slices one by one
  double worst_rel_l2 = 0;
  std::vector<std::pair<int64_t, int64_t>> slices;  // (batch, head) compared
};

struct CopyCeiling {
  double tbps = 0, memcpy_tbps = 0, kernel_tbps = 0;
  int64_t bytes = 0;
};

// One run of the suite: what every JSON rewrite needs.
struct FwdRun {
  const FwdOptions* opt = nullptr;
  DeviceInfo dev;
  std::string date;
  Clocks before, after;
  double peak_mhz = 0;
  CopyCeiling copy;
  std::vector<FwdRecord> records;
  std::vector<AccuracyRecord> accuracy;
  bool complete = false;
};

// "fa3-d128-s2048-noncausal"
std::string fa3_case(const FwdPoint& p);
// The median of the SM clocks measured after each point's timed loop (NaN when none).
double median_clock(const FwdRun& s);
// Writes the suite's JSON to s.opt->out_path; false (with a message) when it cannot.
bool write_json(const FwdRun& s);
// The console table: its header, and one line per record.
void print_header();
void print_record(const FwdRecord& r);

}  // namespace fp4attn::bench
