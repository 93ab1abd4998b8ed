#include "fwd_accuracy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "fp4attn/golden/reference.h"
#include "fp4attn/tensor.h"

namespace fp4attn::bench {
namespace {

// A view of rows [0, n) of a [s][d] BF16 slice as a [1, n, 1, d] BSHD tensor.
TensorView rows_view(const std::vector<uint16_t>& x, int64_t first, int64_t n, int64_t d) {
  return make_strided_view(const_cast<uint16_t*>(x.data()) + first * d, DType::kBF16, {1, n, 1, d},
                           {n * d, d, d, 1});
}

}  // namespace

double bf16_bits_to_double(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<int64_t> sample_rows(int64_t s, int n) {
  std::vector<int64_t> rows;
  if (s <= 0 || n <= 0) return rows;
  if (s <= n) {
    for (int64_t i = 0; i < s; ++i) rows.push_back(i);
    return rows;
  }
  if (n == 1) return {s - 1};
  for (int i = 0; i < n; ++i) rows.push_back(i * (s - 1) / (n - 1));
  return rows;
}

Status reference_rows(const HostSlice& x, const std::vector<int64_t>& rows, bool causal,
                      std::vector<double>* out) {
  const int64_t d = x.d;
  out->assign(rows.size() * d, 0.0);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Status first_error;
  std::atomic_flag error_taken = ATOMIC_FLAG_INIT;
  // One reference call per row: its own key prefix under causal; a single row is one work item
  // of the reference, so it runs on the calling thread and the rows can be spread here.
  auto worker = [&] {
    for (size_t r = next++; r < rows.size() && !failed; r = next++) {
      const int64_t i = rows[r];
      const int64_t n = causal ? std::clamp<int64_t>(i + x.s_k - x.s_q + 1, 0, x.s_k) : x.s_k;
      if (n == 0) continue;  // no visible key: O = 0
      const TensorView o =
          make_strided_view(out->data() + r * d, DType::kF64, {1, 1, 1, d}, {d, d, d, 1});
      const Status st =
          reference_attention_forward(rows_view(x.q, i, 1, d), rows_view(x.k, 0, n, d),
                                      rows_view(x.v, 0, n, d), AttentionOptions{}, o, TensorView{});
      if (!st.ok() && !error_taken.test_and_set()) {
        first_error = st;
        failed = true;
      }
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>(hw, std::max<size_t>(rows.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return failed ? first_error : Status::Ok();
}

Status reference_slice(const HostSlice& x, bool causal, std::vector<double>* out) {
  out->assign(static_cast<size_t>(x.s_q * x.d), 0.0);
  AttentionOptions opt;
  opt.causal = causal;
  const TensorView o = make_view(out->data(), DType::kF64, {1, x.s_q, 1, x.d});
  return reference_attention_forward(rows_view(x.q, 0, x.s_q, x.d), rows_view(x.k, 0, x.s_k, x.d),
                                     rows_view(x.v, 0, x.s_k, x.d), opt, o, TensorView{});
}

std::vector<double> pick_rows(const std::vector<uint16_t>& o, int64_t d,
                              const std::vector<int64_t>& rows) {
  std::vector<double> out;
  out.reserve(rows.size() * d);
  for (const int64_t i : rows) {
    for (int64_t c = 0; c < d; ++c) out.push_back(bf16_bits_to_double(o[i * d + c]));
  }
  return out;
}

}  // namespace fp4attn::bench
