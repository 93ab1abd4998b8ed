// Accuracy of the fwd suite against the float64 reference (include/fp4attn/golden/reference.h) on one
// (batch, head) slice: a sample of query rows at every grid point (the reference of a whole 16k
// slice would take minutes), and whole slices at the FA3 comparison shape.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/status.h"
#include "harness/metrics.h"

namespace fp4attn::bench {

// One (batch, head) slice on the host, raw BF16 bits: q [s_q][d], k and v [s_k][d].
struct HostSlice {
  int64_t s_q = 0, s_k = 0, d = 0;
  std::vector<uint16_t> q, k, v;
};

// Up to n query rows spread evenly over [0, s), the first and the last included.
std::vector<int64_t> sample_rows(int64_t s, int n);

// The float64 output rows `rows` of the slice, [rows.size()][d]. Causal is bottom-right aligned
// (row i sees keys j <= i + s_k - s_q), so each row is its own reference call on its visible key
// prefix; the rows are spread over the host's threads.
Status reference_rows(const HostSlice& x, const std::vector<int64_t>& rows, bool causal,
                      std::vector<double>* out);

// The whole float64 output of the slice, [s_q][d] (the reference's own threads).
Status reference_slice(const HostSlice& x, bool causal, std::vector<double>* out);

// Rows `rows` of a BF16 output slice [s_q][d] as doubles, [rows.size()][d].
std::vector<double> pick_rows(const std::vector<uint16_t>& o, int64_t d,
                              const std::vector<int64_t>& rows);

double bf16_bits_to_double(uint16_t bits);

}  // namespace fp4attn::bench
