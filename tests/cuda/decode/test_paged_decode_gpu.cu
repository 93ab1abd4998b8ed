// GPU paged decode (paged_attention_cuda.h) against the golden paged attention (paged_kv.h) on
// the same cache bytes: the cache is written by the host append (random BF16 tokens, calibrated
// globals) into a host page pool, copied byte for byte to the device, and both sides read it
// through views with the same strides. Random page tables with shuffled page ids (entries past a
// sequence's last page are -1), page sizes 16 and 64, ragged lengths including 1, 17, 1000 and
// 5000, GQA 32/8, 8/8 and 4/1, head_dim 64 and 128, 1 and 4 query tokens, NVFP4 and FP8, with and
// without splits (the heuristic, none, forced), rank-4 and varlen q, compact and interleaved
// pools. Outputs are poisoned with NaN before each call; a second call must give the same bits.
//
// Tolerance (docs/kernels/decode.md 7.4). The kernel and the golden read the same values (the
// kernel's E2M1 x E4M3 products are exact in BF16, 1/s_enc is applied in FP32: one FP32 rounding
// apart). The differences: P is rounded to BF16 (unit roundoff 2^-8) before the P V MMA, which
// moves O by at most 2^-8 * max|v| (the weights of a convex combination each change by <= 2^-8
// relative); the output is rounded to BF16 (<= 2^-8 |o|); FP32 scores and sums, ex2.approx:
// ~1e-5 relative. Allowed per element: 2^-7 * max|v| + 2^-7 * |o| (twice the bound), and over
// all elements a relative L2 <= 2^-7 (expected ~0.0023, see check_cache). LSE: only FP32 sums
// and scores, ~1e-5 relative: allowed 1e-3 absolute (+1e-5 relative).
// Float64: the GPU output's cosine / rel-L2 against float64 attention on the *unquantized* tokens
// must match the golden model's own (the format's error) to 1e-3: the kernel adds no error of
// its own beyond that.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/paged_attention_cuda.h"
#include "fp4attn/paged_kv_cuda.h"
#include "harness/metrics.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr double kInf = std::numeric_limits<double>::infinity();

// A device allocation holding a copy of host bytes (or n bytes of `fill`).
class Dev {
 public:
  Dev() = default;
  explicit Dev(size_t n, int fill = 0) : n_(n) {
    ok_ = cudaMalloc(&p_, std::max<size_t>(n, 16)) == cudaSuccess &&
          cudaMemset(p_, fill, std::max<size_t>(n, 16)) == cudaSuccess;
  }
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    ok_ = ok_ && (v.empty() || cudaMemcpy(p_, v.data(), n_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  bool ok() const { return ok_; }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> v(n_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  bool ok_ = false;
};

// ---- the cache ---------------------------------------------------------------------------------

struct Config {
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  int64_t page_size = 16, d = 128, h = 32, h_kv = 8, s_q = 1;
  std::vector<int32_t> lens = {1, 17, 1000, 5000};
  int splits = 0;            // PagedAttentionCudaOptions::num_splits
  bool host_copies = true;   // pass the index tensors' host copies
  bool interleaved = false;  // per-page [K data | K scales | V data | V scales] pool
  bool odd_scales = false;   // compact pool with the scale arrays at odd byte offsets: the NVFP4
                             // ring's byte-copy fallback and the K scales' byte loads
  bool varlen = false;       // rank-3 q with cu_seqlens_q (s_q per sequence: s_q, s_q - 1, ...)
  bool causal = true;
  int64_t zero_tokens = 0;  // the first tokens (in sequence order) are zeros, appended alone first
  uint32_t seed = 1;

  bool fp4() const { return format == KvCacheFormat::kNvfp4; }
  std::string str() const {
    std::string s = std::string(kv_cache_format_name(format)) + " ps " + std::to_string(page_size) +
                    " d " + std::to_string(d) + " h " + std::to_string(h) + "/" +
                    std::to_string(h_kv) + " s_q " + std::to_string(s_q) + " splits " +
                    std::to_string(splits) + " lens";
    for (int32_t l : lens) s += " " + std::to_string(l);
    if (varlen) s += " varlen";
    if (interleaved) s += " interleaved";
    if (odd_scales) s += " odd-scales";
    if (!host_copies) s += " no-host-copies";
    if (!causal) s += " non-causal";
    if (zero_tokens > 0) s += " zero-tokens " + std::to_string(zero_tokens);
    return s;
  }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A cache written by the host append, its page table, and the original tokens.
struct Cache {
  Config c;
  int64_t pages = 0, max_pages = 0;
  int64_t row_data = 0, row_scales = 0;  // bytes per (token, head)
  int64_t off[4] = {0, 0, 0, 0};         // pool offsets of k data, k scales, v data, v scales
  int64_t page_stride[2] = {0, 0};       // data, scales
  std::vector<uint8_t> pool;
  float globals[2] = {0.f, 0.f};
  std::vector<int32_t> block_tables, seq_lens;
  // Original BF16 tokens, [b][L][h_kv][d] flattened per sequence.
  std::vector<std::vector<uint16_t>> k, v;
  // The appends that wrote the pool: tokens [0, first) (Config::zero_tokens), then the rest.
  std::vector<uint16_t> kt, vt;  // [total, h_kv, d]
  std::vector<int32_t> slots;
  int64_t first = 0;
  float globals_first[2] = {0.f, 0.f};  // after the first append

  PagedKvCache views(uint8_t* base, float* g) const {
    auto view = [&](int64_t o, int64_t row, int64_t ps) {
      return make_strided_view(base + o, DType::kU8, {pages, c.page_size, c.h_kv, row},
                               {ps, c.h_kv * row, row, 1});
    };
    PagedKvCache v{};
    v.format = c.format;
    v.k_data = view(off[0], row_data, page_stride[0]);
    v.v_data = view(off[2], row_data, page_stride[0]);
    if (c.fp4()) {
      v.k_scales = view(off[1], row_scales, page_stride[1]);
      v.v_scales = view(off[3], row_scales, page_stride[1]);
    }
    v.k_global = make_view(g, DType::kF32, {1});
    v.v_global = make_view(g + 1, DType::kF32, {1});
    return v;
  }
};

Cache make_cache(const Config& c) {
  Cache x;
  x.c = c;
  const int64_t b = static_cast<int64_t>(c.lens.size());
  std::mt19937 rng(c.seed);
  int64_t needed = 0;
  for (int32_t l : c.lens) {
    needed += ceil_div(l, c.page_size);
    x.max_pages = std::max(x.max_pages, ceil_div(l, c.page_size));
  }
  x.max_pages += 1;  // one unused entry per row (-1)
  x.pages = needed + 3;
  x.row_data = c.fp4() ? c.d / 2 : c.d;
  x.row_scales = c.fp4() ? c.d / 16 : 0;
  const int64_t dp = c.page_size * c.h_kv * x.row_data, sp = c.page_size * c.h_kv * x.row_scales;
  if (c.interleaved) {
    const int64_t stride = ceil_div(2 * (dp + sp) + 48, 16) * 16;
    x.off[0] = 0;
    x.off[1] = dp;
    x.off[2] = ceil_div(dp + sp, 16) * 16;
    x.off[3] = x.off[2] + dp;
    x.page_stride[0] = x.page_stride[1] = stride;
    x.pool.assign(x.pages * stride, 0x5A);
  } else {
    x.off[0] = 0;
    x.off[1] = x.pages * dp + (c.odd_scales ? 1 : 0);
    x.off[2] = ceil_div(x.off[1] + x.pages * sp, 16) * 16;
    x.off[3] = x.off[2] + x.pages * dp + (c.odd_scales ? 1 : 0);
    x.page_stride[0] = dp;
    x.page_stride[1] = sp;
    x.pool.assign(x.off[3] + x.pages * sp, 0x5A);
  }
  // Shuffled page ids, handed out in order.
  std::vector<int32_t> ids(x.pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  x.block_tables.assign(b * x.max_pages, -1);
  x.seq_lens = c.lens;
  int64_t next = 0, tokens = 0;
  std::vector<int32_t>& slots = x.slots;
  std::vector<uint16_t>& kt = x.kt;
  std::vector<uint16_t>& vt = x.vt;
  std::normal_distribution<float> normal(0.f, 1.f);
  x.k.resize(b);
  x.v.resize(b);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t p = 0; p < ceil_div(c.lens[bi], c.page_size); ++p) {
      x.block_tables[bi * x.max_pages + p] = ids[next++];
    }
    const int64_t n = c.lens[bi] * c.h_kv * c.d;
    x.k[bi].resize(n);
    x.v[bi].resize(n);
    for (int64_t i = 0; i < n; ++i) {
      // Keys with a per-channel offset (as real keys have), values N(0, 1).
      x.k[bi][i] = float_to_bf16_bits(normal(rng) + 0.5f * std::sin(0.37f * (i % c.d)));
      x.v[bi][i] = float_to_bf16_bits(normal(rng));
      if (tokens + i / (c.h_kv * c.d) < c.zero_tokens) x.k[bi][i] = x.v[bi][i] = i % 2 ? 0x8000 : 0;
    }
    tokens += c.lens[bi];
    kt.insert(kt.end(), x.k[bi].begin(), x.k[bi].end());
    vt.insert(vt.end(), x.v[bi].begin(), x.v[bi].end());
    for (int64_t j = 0; j < c.lens[bi]; ++j) {
      slots.push_back(static_cast<int32_t>(paged_kv_slot(
          x.block_tables[bi * x.max_pages + j / c.page_size], c.page_size, j % c.page_size)));
    }
  }
  const int64_t total = static_cast<int64_t>(slots.size()), row = c.h_kv * c.d;
  x.first = std::min(c.zero_tokens, total);
  auto append = [&](int64_t t0, int64_t n) {
    if (n == 0) return;
    const Status st = paged_kv_append(
        make_view(kt.data() + t0 * row, DType::kBF16, {n, c.h_kv, c.d}),
        make_view(vt.data() + t0 * row, DType::kBF16, {n, c.h_kv, c.d}),
        make_view(slots.data() + t0, DType::kI32, {n}), x.views(x.pool.data(), x.globals));
    EXPECT_TRUE(st.ok()) << st.message();
  };
  append(0, x.first);
  std::copy(x.globals, x.globals + 2, x.globals_first);
  append(x.first, total - x.first);
  return x;
}

// ---- one comparison ----------------------------------------------------------------------------

struct Query {
  std::vector<uint16_t> q;  // BF16
  std::vector<int32_t> cu;  // varlen only
  int64_t total_q = 0;
  std::vector<int64_t> sq;  // per sequence
};

Query make_query(const Config& c, uint32_t seed) {
  Query x;
  const int64_t b = static_cast<int64_t>(c.lens.size());
  x.cu.push_back(0);
  for (int64_t bi = 0; bi < b; ++bi) {
    // varlen: s_q, s_q - 1, ..., at least 0 (an empty sequence too).
    const int64_t s = c.varlen ? std::max<int64_t>(c.s_q - bi % (c.s_q + 1), 0) : c.s_q;
    x.sq.push_back(s);
    x.total_q += s;
    x.cu.push_back(static_cast<int32_t>(x.total_q));
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  x.q.resize(x.total_q * c.h * c.d);
  for (auto& e : x.q) e = float_to_bf16_bits(normal(rng));
  return x;
}

TensorView q_view(const Config& c, const Query& x, void* data) {
  const int64_t b = static_cast<int64_t>(c.lens.size());
  return c.varlen ? make_view(data, DType::kBF16, {x.total_q, c.h, c.d})
                  : make_view(data, DType::kBF16, {b, c.s_q, c.h, c.d});
}
TensorView lse_view(const Config& c, const Query& x, void* data, DType dt) {
  const int64_t b = static_cast<int64_t>(c.lens.size());
  return c.varlen ? make_view(data, dt, {c.h, x.total_q}) : make_view(data, dt, {b, c.h, c.s_q});
}
// Index of the LSE of (row r, head hq) in lse_view's layout.
int64_t lse_index(const Config& c, const Query& x, int64_t r, int64_t hq) {
  if (c.varlen) return hq * x.total_q + r;
  return (r / c.s_q) * c.h * c.s_q + hq * c.s_q + r % c.s_q;
}

// float64 attention on the unquantized BF16 tokens (the format's accuracy reference), in q's row
// order: [total_q, h, d].
std::vector<double> unquantized_reference(const Cache& cache, const Query& x) {
  const Config& c = cache.c;
  const int64_t group = c.h / c.h_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> out(x.total_q * c.h * c.d, 0.0);
  int64_t r0 = 0;
  for (size_t bi = 0; bi < c.lens.size(); ++bi) {
    const int64_t len = c.lens[bi], s = x.sq[bi];
    for (int64_t i = 0; i < s; ++i) {
      const int64_t vis = c.causal ? std::clamp<int64_t>(i + len - s + 1, 0, len) : len;
      for (int64_t hq = 0; hq < c.h; ++hq) {
        const int64_t hk = hq / group;
        const uint16_t* q = x.q.data() + ((r0 + i) * c.h + hq) * c.d;
        std::vector<double> sc(vis);
        double m = -kInf;
        for (int64_t j = 0; j < vis; ++j) {
          double acc = 0;
          const uint16_t* kr = cache.k[bi].data() + (j * c.h_kv + hk) * c.d;
          for (int64_t e = 0; e < c.d; ++e)
            acc += bf16_bits_to_float(q[e]) * bf16_bits_to_float(kr[e]);
          sc[j] = acc * scale;
          m = std::max(m, sc[j]);
        }
        double sum = 0;
        for (auto& e : sc) sum += (e = std::exp(e - m));
        double* o = out.data() + ((r0 + i) * c.h + hq) * c.d;
        for (int64_t j = 0; j < vis; ++j) {
          const uint16_t* vr = cache.v[bi].data() + (j * c.h_kv + hk) * c.d;
          for (int64_t e = 0; e < c.d; ++e) o[e] += sc[j] / sum * bf16_bits_to_float(vr[e]);
        }
      }
    }
    r0 += s;
  }
  return out;
}

// Max |v| over each (sequence, kv head) of the decoded cache (for the tolerance).
std::vector<double> max_abs_v(const Cache& cache) {
  const Config& c = cache.c;
  const int64_t b = static_cast<int64_t>(c.lens.size());
  int64_t max_len = 1;
  for (int32_t l : c.lens) max_len = std::max<int64_t>(max_len, l);
  std::vector<float> kd(b * max_len * c.h_kv * c.d), vd(kd.size());
  std::vector<uint8_t> pool = cache.pool;
  float g[2] = {cache.globals[0], cache.globals[1]};
  std::vector<int32_t> bt = cache.block_tables, sl = cache.seq_lens;
  const Status st = paged_kv_dequantize(
      cache.views(pool.data(), g), make_view(bt.data(), DType::kI32, {b, cache.max_pages}),
      make_view(sl.data(), DType::kI32, {b}),
      make_view(kd.data(), DType::kF32, {b, max_len, c.h_kv, c.d}),
      make_view(vd.data(), DType::kF32, {b, max_len, c.h_kv, c.d}));
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<double> m(b * c.h_kv, 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < c.lens[bi]; ++j) {
      for (int64_t hk = 0; hk < c.h_kv; ++hk) {
        for (int64_t e = 0; e < c.d; ++e) {
          const double a = std::fabs(vd[((bi * max_len + j) * c.h_kv + hk) * c.d + e]);
          m[bi * c.h_kv + hk] = std::max(m[bi * c.h_kv + hk], a);
        }
      }
    }
  }
  return m;
}

// Runs the golden model and the GPU (twice) on one cache and compares.
void check_cache(const Cache& cache) {
  const Config& c = cache.c;
  const Query x = make_query(c, c.seed + 77);
  const int64_t b = static_cast<int64_t>(c.lens.size());
  const int64_t group = c.h / c.h_kv;
  const int64_t n_out = x.total_q * c.h * c.d, n_lse = x.total_q * c.h;

  // Golden, float64, on host copies of the same bytes.
  std::vector<uint8_t> hpool = cache.pool;
  float hg[2] = {cache.globals[0], cache.globals[1]};
  std::vector<int32_t> bt = cache.block_tables, sl = cache.seq_lens, cu = x.cu;
  std::vector<uint16_t> hq = x.q;
  std::vector<double> o_ref(n_out), lse_ref(n_lse);
  PagedAttentionOptions opt;
  opt.causal = c.causal;
  const TensorView bt_h = make_view(bt.data(), DType::kI32, {b, cache.max_pages});
  const TensorView sl_h = make_view(sl.data(), DType::kI32, {b});
  const TensorView cu_h = c.varlen ? make_view(cu.data(), DType::kI32, {b + 1}) : TensorView{};
  Status st = golden_paged_attention(
      q_view(c, x, hq.data()), cu_h, cache.views(hpool.data(), hg), bt_h, sl_h, opt,
      c.varlen ? make_view(o_ref.data(), DType::kF64, {x.total_q, c.h, c.d})
               : make_view(o_ref.data(), DType::kF64, {b, c.s_q, c.h, c.d}),
      lse_view(c, x, lse_ref.data(), DType::kF64));
  ASSERT_TRUE(st.ok()) << st.message();

  // Device.
  Dev dpool(cache.pool), dglob(std::vector<float>{cache.globals[0], cache.globals[1]});
  Dev dbt(cache.block_tables), dsl(cache.seq_lens), dcu(x.cu), dq(x.q);
  Dev dout(n_out * 2, 0xFF), dlse(n_lse * 4, 0xFF);  // NaN poison (BF16 0xFFFF, F32 0xFFFFFFFF)
  ASSERT_TRUE(dpool.ok() && dglob.ok() && dbt.ok() && dsl.ok() && dcu.ok() && dq.ok() &&
              dout.ok() && dlse.ok());
  const PagedKvCache dcache = cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get()));
  PagedAttentionCudaOptions copt;
  copt.num_splits = c.splits;
  if (c.host_copies) {
    copt.block_tables_host = bt_h;
    copt.seq_lens_host = sl_h;
    copt.cu_seqlens_q_host = cu_h;
  }
  const TensorView dq_v = q_view(c, x, dq.get());
  const TensorView dcu_v = c.varlen ? make_view(dcu.get(), DType::kI32, {b + 1}) : TensorView{};
  const TensorView do_v = c.varlen ? make_view(dout.get(), DType::kBF16, {x.total_q, c.h, c.d})
                                   : make_view(dout.get(), DType::kBF16, {b, c.s_q, c.h, c.d});
  const TensorView dl_v = lse_view(c, x, dlse.get(), DType::kF32);
  auto call = [&]() {
    return paged_attention_cuda(
        dq_v, dcu_v, dcache, make_view(dbt.get(), DType::kI32, {b, cache.max_pages}),
        make_view(dsl.get(), DType::kI32, {b}), opt, do_v, dl_v, copt, nullptr);
  };
  st = call();
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
  const std::vector<uint16_t> o1 = dout.download<uint16_t>();
  const std::vector<float> l1 = dlse.download<float>();
  // A second call on re-poisoned outputs: the same bits.
  CUDA_OK(cudaMemset(dout.get(), 0xFF, n_out * 2));
  CUDA_OK(cudaMemset(dlse.get(), 0xFF, n_lse * 4));
  st = call();
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> o2 = dout.download<uint16_t>();
  const std::vector<float> l2 = dlse.download<float>();
  EXPECT_TRUE(std::memcmp(o1.data(), o2.data(), o1.size() * 2) == 0) << "o differs between runs";
  EXPECT_TRUE(std::memcmp(l1.data(), l2.data(), l1.size() * 4) == 0) << "lse differs between runs";

  // Element-wise against the golden model.
  const std::vector<double> vmax = max_abs_v(cache);
  std::vector<int64_t> row_seq(x.total_q);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t r = x.cu[bi]; r < x.cu[bi + 1]; ++r) row_seq[r] = bi;
  }
  int64_t bad = 0, bad_lse = 0;
  double worst = 0;
  std::vector<double> test(n_out);
  for (int64_t r = 0; r < x.total_q; ++r) {
    for (int64_t h = 0; h < c.h; ++h) {
      const double vm = vmax[row_seq[r] * c.h_kv + h / group];
      for (int64_t e = 0; e < c.d; ++e) {
        const int64_t i = (r * c.h + h) * c.d + e;
        const double got = bf16_bits_to_float(o1[i]), want = o_ref[i];
        test[i] = got;
        const double tol = std::ldexp(vm, -7) + std::ldexp(std::fabs(want), -7);
        const double err = std::fabs(got - want);
        if (!(err <= tol)) {
          if (bad++ < 5) {
            ADD_FAILURE() << "o[row " << r << ", head " << h << ", " << e << "] = " << got
                          << ", golden " << want << ", tolerance " << tol;
          }
        }
        if (std::isfinite(err)) worst = std::max(worst, err / std::max(vm, 1e-30));
      }
      const int64_t li = lse_index(c, x, r, h);
      const double gl = l1[li], wl = lse_ref[li];
      const bool ok = std::isinf(wl) ? gl == wl : std::fabs(gl - wl) <= 1e-3 + 1e-5 * std::fabs(wl);
      if (!ok && bad_lse++ < 5) {
        ADD_FAILURE() << "lse[row " << r << ", head " << h << "] = " << gl << ", golden " << wl;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements outside the tolerance (worst |err| / max|v| = " << worst << ")";
  EXPECT_EQ(bad_lse, 0);
  // In aggregate the errors are far below the worst case: P's BF16 rounding (relative rms about
  // 2^-8 * 0.43, for mantissas spread over a binade) and the output's (the same) are independent,
  // so the relative L2 against the golden model is about 0.0023; 2^-7 (3.4x that) catches a
  // systematic error (a scale, a channel or key map) that the element bound, sized for the worst
  // case, could let through.
  if (x.total_q > 0) {
    const ErrorStats vs_golden = compare(test.data(), o_ref.data(), n_out);
    EXPECT_LE(vs_golden.rel_l2, std::ldexp(1.0, -7)) << "rel_l2 against the golden model";
  }

  // Float64 on the unquantized tokens: the kernel's accuracy equals the format's.
  if (x.total_q > 0) {
    const std::vector<double> ref = unquantized_reference(cache, x);
    const ErrorStats gpu = compare(test.data(), ref.data(), n_out);
    const ErrorStats gold = compare(o_ref.data(), ref.data(), n_out);
    EXPECT_EQ(gpu.nan_mismatch, 0);
    EXPECT_NEAR(gpu.cos, gold.cos, 1e-3)
        << "cos vs float64 (unquantized): gpu " << gpu.cos << ", golden " << gold.cos;
    EXPECT_NEAR(gpu.rel_l2, gold.rel_l2, 2e-3)
        << "rel_l2 vs float64: gpu " << gpu.rel_l2 << ", golden " << gold.rel_l2;
    EXPECT_GT(gpu.cos, 0.9);
    std::printf(
        "[ decode  ] %s: cos %.6f rel_l2 %.5f (format alone: %.6f, %.5f), worst "
        "|err|/max|v| %.2e\n",
        c.str().c_str(), gpu.cos, gpu.rel_l2, gold.cos, gold.rel_l2, worst);
  }
}

void check_config(const Config& c) {
  SCOPED_TRACE(c.str());
  const Cache cache = make_cache(c);
  if (::testing::Test::HasFailure()) return;
  check_cache(cache);
}

// ---- the sweep
// -----------------------------------------------------------------------------------

struct Gqa {
  int64_t h, h_kv;
};
constexpr Gqa kGqa[] = {{32, 8}, {8, 8}, {4, 1}};

void sweep(KvCacheFormat format, int64_t d) {
  uint32_t seed = 100 * static_cast<uint32_t>(d) + (format == KvCacheFormat::kFp8 ? 7 : 0);
  for (int64_t page_size : {16, 64}) {
    for (const Gqa& g : kGqa) {
      for (int64_t s_q : {1, 4}) {
        Config c;
        c.format = format;
        c.page_size = page_size;
        c.d = d;
        c.h = g.h;
        c.h_kv = g.h_kv;
        c.s_q = s_q;
        c.seed = ++seed;
        // Splits: the heuristic, none, forced (7 of the longest sequence).
        c.splits = seed % 3 == 0 ? 0 : seed % 3 == 1 ? 1 : 7;
        c.lens = seed % 2 ? std::vector<int32_t>{1, 17, 1000, 5000}
                          : std::vector<int32_t>{300, 64, 17, 2049, 1};
        c.interleaved = seed % 4 == 1;
        c.odd_scales = format == KvCacheFormat::kNvfp4 && seed % 4 == 3;
        check_config(c);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(PagedDecodeGpu, Nvfp4D128) {
  SKIP_WITHOUT_GPU();
  sweep(KvCacheFormat::kNvfp4, 128);
}
TEST(PagedDecodeGpu, Nvfp4D64) {
  SKIP_WITHOUT_GPU();
  sweep(KvCacheFormat::kNvfp4, 64);
}
TEST(PagedDecodeGpu, Fp8D128) {
  SKIP_WITHOUT_GPU();
  sweep(KvCacheFormat::kFp8, 128);
}
TEST(PagedDecodeGpu, Fp8D64) {
  SKIP_WITHOUT_GPU();
  sweep(KvCacheFormat::kFp8, 64);
}

// Appends of zeros leave the globals uncalibrated (0) on the device as on the host, and the next
// append calibrates them: the same appends on the device (paged_kv_append_cuda) give the host's
// pool bytes and globals, and decode over the device-written cache matches the golden model; a
// cache of zeros alone (globals still 0 at decode) gives O = 0. Both formats.
TEST(PagedDecodeGpu, ZeroFirstAppendThenDataMatchesTheGolden) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (bool all_zero : {false, true}) {
      Config c;
      c.format = format;
      c.h = 8;
      c.h_kv = 2;
      c.lens = {40, 1, 300};
      c.zero_tokens = all_zero ? 341 : 41;  // sequences 0 and 1, or everything
      c.seed = all_zero ? 91 : 92;
      SCOPED_TRACE(c.str());
      const Cache host = make_cache(c);
      ASSERT_FALSE(::testing::Test::HasFailure());
      EXPECT_EQ(host.globals_first[0], 0.f);
      EXPECT_EQ(host.globals_first[1], 0.f);
      EXPECT_EQ(host.globals[0] == 0.f, all_zero);
      EXPECT_EQ(host.globals[1] == 0.f, all_zero);

      // The same two appends on the device, into a pool holding the host pool's first bytes.
      Dev dpool(std::vector<uint8_t>(host.pool.size(), 0x5A));
      Dev dglob(std::vector<float>{0.f, 0.f});
      Dev dk(host.kt), dv(host.vt), ds(host.slots);
      ASSERT_TRUE(dpool.ok() && dglob.ok() && dk.ok() && dv.ok() && ds.ok());
      const PagedKvCache dcache = host.views(dpool.get(), reinterpret_cast<float*>(dglob.get()));
      const int64_t total = static_cast<int64_t>(host.slots.size()), row = c.h_kv * c.d;
      auto append = [&](int64_t t0, int64_t n) {
        const Status st =
            paged_kv_append_cuda(make_view(dk.get() + 2 * t0 * row, DType::kBF16, {n, c.h_kv, c.d}),
                                 make_view(dv.get() + 2 * t0 * row, DType::kBF16, {n, c.h_kv, c.d}),
                                 make_view(ds.get() + 4 * t0, DType::kI32, {n}), dcache,
                                 PagedAppendCudaOptions{}, nullptr);
        EXPECT_TRUE(st.ok()) << st.message();
      };
      append(0, host.first);
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> g = dglob.download<float>();
      EXPECT_EQ(g[0], 0.f);
      EXPECT_EQ(g[1], 0.f);
      append(host.first, total - host.first);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaGetLastError());
      g = dglob.download<float>();
      EXPECT_EQ(g[0], host.globals[0]);
      EXPECT_EQ(g[1], host.globals[1]);
      Cache device = host;
      device.pool = dpool.download<uint8_t>();
      EXPECT_TRUE(device.pool == host.pool) << "the device append's pool differs from the host's";
      std::copy(g.begin(), g.end(), device.globals);
      if (::testing::Test::HasFailure()) return;
      check_cache(device);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The transposed kernel (<= 8 query rows per kv head, decode.md 7.8): 32/8 and 8/8 with one token,
// 16/4 and 32/8 with two (8 rows), both formats, d 64 and 128, page sizes 16, 64 and 24 (per-key
// lookups), full and partial tiles (lengths around tile and page edges), the split plan's choice
// and forced splits; 9 rows (3/1 x 3 tokens) take the 16-row kernel, next to it.
TEST(PagedDecodeGpu, TransposedFewRows) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t h, h_kv, s_q;
  };
  constexpr Shape kShapes[] = {{32, 8, 1}, {8, 8, 1}, {16, 4, 2}, {32, 8, 2}, {3, 1, 3}};
  uint32_t seed = 2100;
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int64_t d : {64, 128}) {
      for (int64_t page_size : {16, 64, 24}) {
        for (const Shape& sh : kShapes) {
          Config c;
          c.format = f;
          c.d = d;
          c.page_size = page_size;
          c.h = sh.h;
          c.h_kv = sh.h_kv;
          c.s_q = sh.s_q;
          c.seed = ++seed;
          c.splits = seed % 3 == 0 ? 0 : seed % 3 == 1 ? 1 : 5;
          c.lens = seed % 2 ? std::vector<int32_t>{16, 4096, 63, 1, 2063}
                            : std::vector<int32_t>{4111, 15, 64, 129, 7};
          c.interleaved = seed % 4 == 1;
          check_config(c);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Every split mode on one long sequence and a short batch, both formats: forced splits of many
// sizes (empty splits included), the heuristic, none.
TEST(PagedDecodeGpu, SplitModes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int splits : {0, 1, 2, 5, 33, 100}) {
      Config c;
      c.format = f;
      c.h = 8;
      c.h_kv = 2;
      c.s_q = 2;
      c.lens = {4000, 33, 1};
      c.splits = splits;
      c.seed = ++seed;
      check_config(c);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Varlen q (rank 3, cu_seqlens_q; sequences with 4, 3, 2, 1, 0 queries), with and without host
// copies (without them the CTA loops over its row blocks), non-causal, a page size that is not a
// multiple of 16 (per-key page lookups), and more rows than one block (group 8 x 4 tokens = 32:
// the functional prefill path).
TEST(PagedDecodeGpu, VarlenNonCausalOddPagesAndLongChunks) {
  SKIP_WITHOUT_GPU();
  Config base;
  base.h = 16;
  base.h_kv = 4;
  base.s_q = 4;
  base.lens = {900, 5, 130, 1, 77};
  uint32_t seed = 1200;
  for (bool host : {true, false}) {
    for (bool causal : {true, false}) {
      Config c = base;
      c.varlen = true;
      c.host_copies = host;
      c.causal = causal;
      c.seed = ++seed;
      check_config(c);
      if (::testing::Test::HasFailure()) return;
    }
  }
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    Config c = base;
    c.format = f;
    c.page_size = 24;  // pages not aligned with the 16-key tiles
    c.seed = ++seed;
    check_config(c);
    c.page_size = 16;
    c.h = 32;
    c.h_kv = 4;  // group 8 x s_q 4 = 32 rows: two row blocks
    c.seed = ++seed;
    check_config(c);
    c.varlen = true;
    c.host_copies = false;
    c.seed = ++seed;
    check_config(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// The split partials against golden_paged_attention_partials, and the GPU combine against
// combine_attention_partials on the same partials.
TEST(PagedDecodeGpu, PartialsAndCombineMatchTheGolden) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    Config c;
    c.format = f;
    c.h = 8;
    c.h_kv = 2;
    c.s_q = 3;
    c.lens = {700, 1, 190};
    c.seed = f == KvCacheFormat::kFp8 ? 31 : 32;
    SCOPED_TRACE(c.str());
    const Cache cache = make_cache(c);
    const Query x = make_query(c, 5);
    const int64_t b = 3, split = 128, splits = 6;  // the last split of every sequence is empty
    const int64_t tq = x.total_q, n = splits * tq * c.h * c.d;
    std::vector<uint8_t> hpool = cache.pool;
    float hg[2] = {cache.globals[0], cache.globals[1]};
    std::vector<int32_t> bt = cache.block_tables, sl = cache.seq_lens;
    std::vector<uint16_t> hq = x.q;
    std::vector<double> op(n), lp(splits * tq * c.h);
    PagedAttentionOptions opt;
    Status st =
        golden_paged_attention_partials(q_view(c, x, hq.data()), {}, cache.views(hpool.data(), hg),
                                        make_view(bt.data(), DType::kI32, {b, cache.max_pages}),
                                        make_view(sl.data(), DType::kI32, {b}), opt, split,
                                        make_view(op.data(), DType::kF64, {splits, tq, c.h, c.d}),
                                        make_view(lp.data(), DType::kF64, {splits, tq, c.h}));
    ASSERT_TRUE(st.ok()) << st.message();
    Dev dpool(cache.pool), dglob(std::vector<float>{cache.globals[0], cache.globals[1]});
    Dev dbt(cache.block_tables), dsl(cache.seq_lens), dq(x.q);
    Dev dop(n * 4, 0xFF), dlp(splits * tq * c.h * 4, 0xFF);
    ASSERT_TRUE(dpool.ok() && dglob.ok() && dbt.ok() && dsl.ok() && dq.ok() && dop.ok() &&
                dlp.ok());
    PagedAttentionCudaOptions copt;
    st = paged_attention_partials_cuda(
        q_view(c, x, dq.get()), {}, cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get())),
        make_view(dbt.get(), DType::kI32, {b, cache.max_pages}),
        make_view(dsl.get(), DType::kI32, {b}), opt, split,
        make_view(dop.get(), DType::kF32, {splits, tq, c.h, c.d}),
        make_view(dlp.get(), DType::kF32, {splits, tq, c.h}), copt, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> gop = dop.download<float>(), glp = dlp.download<float>();
    const std::vector<double> vmax = max_abs_v(cache);
    int64_t bad = 0;
    for (int64_t s = 0; s < splits; ++s) {
      for (int64_t r = 0; r < tq; ++r) {
        for (int64_t h = 0; h < c.h; ++h) {
          const int64_t li = (s * tq + r) * c.h + h;
          const double wl = lp[li], gl = glp[li];
          if (!(std::isinf(wl) ? gl == wl : std::fabs(gl - wl) <= 1e-3 + 1e-5 * std::fabs(wl))) {
            if (bad++ < 5)
              ADD_FAILURE() << "lse_partial " << s << "," << r << "," << h << ": " << gl << " vs "
                            << wl;
          }
          // Partial O is FP32 (no output rounding): only the P rounding term.
          const double tol = std::ldexp(vmax[(r / c.s_q) * c.h_kv + h / (c.h / c.h_kv)], -7) + 1e-6;
          for (int64_t e = 0; e < c.d; ++e) {
            const double err = std::fabs(gop[li * c.d + e] - op[li * c.d + e]);
            if (!(err <= tol) && bad++ < 5) {
              ADD_FAILURE() << "o_partial " << s << "," << r << "," << h << "," << e << ": "
                            << gop[li * c.d + e] << " vs " << op[li * c.d + e];
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);

    // The combine on the GPU's own partials against the float64 combine of the same partials.
    std::vector<double> gopd(gop.begin(), gop.end()), glpd(glp.begin(), glp.end());
    std::vector<double> o_ref(tq * c.h * c.d), l_ref(c.h * tq);
    st = combine_attention_partials(make_view(gopd.data(), DType::kF64, {splits, tq, c.h, c.d}),
                                    make_view(glpd.data(), DType::kF64, {splits, tq, c.h}),
                                    make_view(o_ref.data(), DType::kF64, {tq, c.h, c.d}),
                                    make_view(l_ref.data(), DType::kF64, {c.h, tq}));
    ASSERT_TRUE(st.ok()) << st.message();
    Dev dco(tq * c.h * c.d * 2, 0xFF), dcl(c.h * tq * 4, 0xFF);
    st = combine_attention_partials_cuda(make_view(dop.get(), DType::kF32, {splits, tq, c.h, c.d}),
                                         make_view(dlp.get(), DType::kF32, {splits, tq, c.h}),
                                         make_view(dco.get(), DType::kBF16, {tq, c.h, c.d}),
                                         make_view(dcl.get(), DType::kF32, {c.h, tq}), nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> co = dco.download<uint16_t>();
    const std::vector<float> cl = dcl.download<float>();
    // FP32 exp/log and sums (~1e-6 relative) and the BF16 output (2^-8 |o|).
    for (size_t i = 0; i < co.size(); ++i) {
      const double got = bf16_bits_to_float(co[i]);
      ASSERT_LE(std::fabs(got - o_ref[i]), std::ldexp(std::fabs(o_ref[i]), -8) + 1e-5)
          << "combined o[" << i << "]";
    }
    for (size_t i = 0; i < cl.size(); ++i) {
      if (std::isinf(l_ref[i])) {
        ASSERT_EQ(cl[i], l_ref[i]) << "combined lse[" << i << "]";
      } else {
        ASSERT_NEAR(cl[i], l_ref[i], 1e-5 + 1e-6 * std::fabs(l_ref[i]))
            << "combined lse[" << i << "]";
      }
    }
  }
}

// ---- the fused combine (decode.md 7.12) -------------------------------------------------------

// The split plan paged_attention_cuda makes for c (decode.cu: max_len and the row blocks from the
// host copies when given, else max_pages * page_size and one row block).
void plan_of(const Config& c, const Cache& cache, const Query& x, int64_t* splits,
             int64_t* split_size) {
  const int64_t b = static_cast<int64_t>(c.lens.size()), group = c.h / c.h_kv;
  int64_t max_len = cache.max_pages * c.page_size, max_sq = c.varlen ? -1 : c.s_q;
  if (c.host_copies) {
    max_len = *std::max_element(c.lens.begin(), c.lens.end());
    max_sq = *std::max_element(x.sq.begin(), x.sq.end());
  }
  // Unknown row counts (varlen without host copies): one row block, the 16-row kernel.
  const int64_t rows = max_sq < 0 ? 16 : std::max<int64_t>(max_sq * group, 1);
  const int64_t row_blocks = max_sq < 0 ? 1 : std::max<int64_t>(1, ceil_div(max_sq * group, 16));
  paged_attention_split_plan(b, c.h_kv, row_blocks, max_len, c.splits, splits, split_size,
                             paged_decode_ctas_per_sm(c.d, c.fp4(), rows));
}

// The fused combine against the two-kernel path it replaced (the partials launch, then the
// combine kernel, on the same split plan): the same bits, whichever CTA of a group arrives last,
// so it is deterministic by construction (the merge runs in split order). Three launches in a
// row on one caller workspace: the first on a dirty one (0xFF: the call zeroes the counters),
// then two marked clean (each launch must have left its counters zero): identical bytes, and the
// counters (the workspace's last total_q x h ints) are zero after every launch. Then the golden
// comparisons (check_config, on a call-owned workspace).
// fused = false: more splits than the fused combine takes (the combine kernel runs; the
// counters are neither used nor zeroed).
void check_fused(const Config& c, bool fused = true) {
  SCOPED_TRACE(c.str());
  const Cache cache = make_cache(c);
  if (::testing::Test::HasFailure()) return;
  const Query x = make_query(c, c.seed + 77);
  const int64_t b = static_cast<int64_t>(c.lens.size()), tq = x.total_q;
  const int64_t n_out = tq * c.h * c.d, n_lse = tq * c.h;
  int64_t splits = 0, split_size = 0;
  plan_of(c, cache, x, &splits, &split_size);
  ASSERT_GE(splits, 2) << "the config must split";
  std::printf("[ fused   ] %s: %lld splits of %lld keys\n", c.str().c_str(),
              static_cast<long long>(splits), static_cast<long long>(split_size));

  std::vector<int32_t> bt = cache.block_tables, sl = cache.seq_lens, cu = x.cu;
  Dev dpool(cache.pool), dglob(std::vector<float>{cache.globals[0], cache.globals[1]});
  Dev dbt(cache.block_tables), dsl(cache.seq_lens), dcu(x.cu), dq(x.q);
  Dev dout(n_out * 2, 0xFF), dlse(n_lse * 4, 0xFF);
  const size_t ws_bytes = paged_attention_workspace_bytes(splits, tq, c.h, c.d);
  ASSERT_GE(ws_bytes, static_cast<size_t>(n_lse * 4));
  Dev ws(ws_bytes, 0xFF);
  Dev dop(splits * n_out * 4, 0xFF), dlp(splits * n_lse * 4, 0xFF);
  Dev dco(n_out * 2, 0xFF), dcl(n_lse * 4, 0xFF);
  ASSERT_TRUE(dpool.ok() && dglob.ok() && dbt.ok() && dsl.ok() && dcu.ok() && dq.ok() &&
              dout.ok() && dlse.ok() && ws.ok() && dop.ok() && dlp.ok() && dco.ok() && dcl.ok());
  const PagedKvCache dcache = cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get()));
  PagedAttentionOptions opt;
  opt.causal = c.causal;
  PagedAttentionCudaOptions copt;
  copt.num_splits = c.splits;
  copt.workspace = ws.get();
  copt.workspace_bytes = ws_bytes;
  if (c.host_copies) {
    copt.block_tables_host = make_view(bt.data(), DType::kI32, {b, cache.max_pages});
    copt.seq_lens_host = make_view(sl.data(), DType::kI32, {b});
    if (c.varlen) copt.cu_seqlens_q_host = make_view(cu.data(), DType::kI32, {b + 1});
  }
  const TensorView dq_v = q_view(c, x, dq.get());
  const TensorView dcu_v = c.varlen ? make_view(dcu.get(), DType::kI32, {b + 1}) : TensorView{};
  const TensorView dbt_v = make_view(dbt.get(), DType::kI32, {b, cache.max_pages});
  const TensorView dsl_v = make_view(dsl.get(), DType::kI32, {b});
  const TensorView do_v = c.varlen ? make_view(dout.get(), DType::kBF16, {tq, c.h, c.d})
                                   : make_view(dout.get(), DType::kBF16, {b, c.s_q, c.h, c.d});
  const TensorView dl_v = lse_view(c, x, dlse.get(), DType::kF32);

  std::vector<uint16_t> o_first;
  std::vector<uint32_t> l_first;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("launch " + std::to_string(run));
    copt.workspace_is_clean = run > 0;
    CUDA_OK(cudaMemset(dout.get(), 0xFF, n_out * 2));
    CUDA_OK(cudaMemset(dlse.get(), 0xFF, n_lse * 4));
    const Status st =
        paged_attention_cuda(dq_v, dcu_v, dcache, dbt_v, dsl_v, opt, do_v, dl_v, copt, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    if (fused) {
      const std::vector<uint8_t> wsb = ws.download<uint8_t>();
      int64_t dirty = 0;
      for (size_t i = ws_bytes - n_lse * 4; i < ws_bytes; ++i) dirty += wsb[i] != 0;
      EXPECT_EQ(dirty, 0) << "counter bytes left non-zero";
    }
    const std::vector<uint16_t> o = dout.download<uint16_t>();
    const std::vector<uint32_t> l = dlse.download<uint32_t>();
    if (run == 0) {
      o_first = o;
      l_first = l;
    } else {
      EXPECT_TRUE(o == o_first) << "o differs from the first launch";
      EXPECT_TRUE(l == l_first) << "lse differs from the first launch";
    }
  }

  // The two-kernel path on the same plan (split_size 0: each sequence split on the device, as
  // paged_attention_cuda splits it).
  Status st = paged_attention_partials_cuda(
      dq_v, dcu_v, dcache, dbt_v, dsl_v, opt, /*split_size=*/0,
      make_view(dop.get(), DType::kF32, {splits, tq, c.h, c.d}),
      make_view(dlp.get(), DType::kF32, {splits, tq, c.h}), copt, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  st = combine_attention_partials_cuda(make_view(dop.get(), DType::kF32, {splits, tq, c.h, c.d}),
                                       make_view(dlp.get(), DType::kF32, {splits, tq, c.h}),
                                       make_view(dco.get(), DType::kBF16, {tq, c.h, c.d}),
                                       make_view(dcl.get(), DType::kF32, {c.h, tq}), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
  const std::vector<uint16_t> co = dco.download<uint16_t>();
  const std::vector<uint32_t> cl = dcl.download<uint32_t>();
  int64_t diff = 0, diff_lse = 0;
  for (int64_t i = 0; i < n_out; ++i) {
    if (co[i] != o_first[i] && diff++ < 5) {
      ADD_FAILURE() << "o[" << i << "]: fused 0x" << std::hex << o_first[i] << ", two kernels 0x"
                    << co[i] << std::dec;
    }
  }
  for (int64_t r = 0; r < tq; ++r) {
    for (int64_t hq = 0; hq < c.h; ++hq) {
      const uint32_t f = l_first[lse_index(c, x, r, hq)], t = cl[hq * tq + r];
      if (f != t && diff_lse++ < 5) {
        ADD_FAILURE() << "lse[row " << r << ", head " << hq << "]: fused 0x" << std::hex << f
                      << ", two kernels 0x" << t << std::dec;
      }
    }
  }
  EXPECT_EQ(diff, 0) << "o elements that differ from the two-kernel path";
  EXPECT_EQ(diff_lse, 0) << "lse elements that differ from the two-kernel path";
  if (::testing::Test::HasFailure()) return;
  check_config(c);
}

// b = 1 and a long sequence (the point the fusion is for) with forced splits from 2 to 100 and
// the heuristic (a partial last split everywhere: 20000 is no multiple of the split sizes).
TEST(PagedDecodeGpu, FusedCombineManySplitsMatchesTwoKernels) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 3100;
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int splits : {0, 2, 3, 17, 64, 100}) {
      Config c;
      c.format = f;
      c.lens = {20000};
      c.splits = splits;
      c.seed = ++seed;
      check_fused(c);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Batches with empty and one-key sequences (a group whose every split is empty: O = 0, LSE =
// +inf), 16-row blocks (s_q 4 x group 4), d = 64, varlen with an empty sequence, and without host
// copies (one row block in the grid: the last arriver merges every row block it looped over).
TEST(PagedDecodeGpu, FusedCombineRaggedBatches) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 3200;
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int splits : {0, 8, 40}) {
      Config c;
      c.format = f;
      c.lens = {0, 1, 5000, 17, 2500};
      c.splits = splits;
      c.seed = ++seed;
      check_fused(c);
      if (::testing::Test::HasFailure()) return;
    }
    Config c;
    c.format = f;
    c.lens = {3000, 0, 1, 700};
    c.s_q = 4;  // 16 rows per kv head: the 16-row kernel
    c.splits = 6;
    c.seed = ++seed;
    check_fused(c);
    c.d = 64;
    c.splits = 9;
    c.seed = ++seed;
    check_fused(c);
    c.d = 128;
    c.varlen = true;  // 4, 3, 2, 1 queries per sequence
    c.lens = {3000, 0, 1, 700, 40};
    c.splits = 7;
    c.seed = ++seed;
    check_fused(c);
    c.host_copies = false;
    c.h = 32;
    c.h_kv = 4;  // group 8 x 4 tokens: two row blocks, looped by one CTA
    c.splits = 5;
    c.seed = ++seed;
    check_fused(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// More splits than the fused combine keeps in shared memory (kFusedMaxSplits: 550 for FP8 d = 128,
// 8 rows): the combine kernel runs after the decode kernel, with the same bits.
TEST(PagedDecodeGpu, FusedCombineFallsBackBeyondItsSplits) {
  SKIP_WITHOUT_GPU();
  Config c;
  c.format = KvCacheFormat::kFp8;
  c.h = 8;
  c.h_kv = 2;
  c.lens = {36000, 100};
  c.splits = 1000;  // 64-key splits: 563 of them
  c.seed = 3300;
  check_fused(c, /*fused=*/false);
}

// Without host copies a bad page id or length is not caught before the launch: the kernel must
// not read it, must make that sequence's rows NaN (the other sequences are untouched) and must
// report both in the error flag; a clean call leaves the flag 0.
TEST(PagedDecodeGpu, UncheckedBadIndicesGiveNanRowsNotReads) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    Config c;
    c.format = f;
    c.h = 8;
    c.h_kv = 2;
    c.lens = {100, 50, 40};
    const Cache cache = make_cache(c);
    const Query x = make_query(c, 9);
    const int64_t b = 3;
    std::vector<int32_t> bt = cache.block_tables, sl = cache.seq_lens;
    bt[0 * cache.max_pages + 2] = 1 << 30;  // sequence 0: page id out of range
    sl[2] = static_cast<int32_t>(cache.max_pages * c.page_size + 1);  // sequence 2: too long
    Dev dpool(cache.pool), dglob(std::vector<float>{cache.globals[0], cache.globals[1]});
    Dev dbt(bt), dsl(sl), dq(x.q), dout(b * c.h * c.d * 2, 0), dlse(b * c.h * 4, 0);
    Dev dflag(4, 0), dbt_ok(cache.block_tables), dsl_ok(cache.seq_lens);
    ASSERT_TRUE(dpool.ok() && dglob.ok() && dbt.ok() && dsl.ok() && dq.ok() && dout.ok() &&
                dflag.ok() && dbt_ok.ok() && dsl_ok.ok());
    for (int splits : {1, 3}) {
      PagedAttentionCudaOptions copt;
      copt.num_splits = splits;
      copt.error_flag = reinterpret_cast<int32_t*>(dflag.get());
      // The good tables first: the flag stays 0.
      ASSERT_TRUE(paged_attention_cuda(
                      make_view(dq.get(), DType::kBF16, {b, 1, c.h, c.d}), {},
                      cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get())),
                      make_view(dbt_ok.get(), DType::kI32, {b, cache.max_pages}),
                      make_view(dsl_ok.get(), DType::kI32, {b}), {},
                      make_view(dout.get(), DType::kBF16, {b, 1, c.h, c.d}), {}, copt, nullptr)
                      .ok());
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(dflag.download<int32_t>()[0], 0) << "flag set by good tables";
      const Status st =
          paged_attention_cuda(make_view(dq.get(), DType::kBF16, {b, 1, c.h, c.d}), {},
                               cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get())),
                               make_view(dbt.get(), DType::kI32, {b, cache.max_pages}),
                               make_view(dsl.get(), DType::kI32, {b}), {},
                               make_view(dout.get(), DType::kBF16, {b, 1, c.h, c.d}),
                               make_view(dlse.get(), DType::kF32, {b, c.h, 1}), copt, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> o = dout.download<uint16_t>();
      const std::vector<float> l = dlse.download<float>();
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t i = 0; i < c.h * c.d; ++i) {
          const float v = bf16_bits_to_float(o[bi * c.h * c.d + i]);
          ASSERT_EQ(std::isnan(v), bi != 1) << "sequence " << bi << " splits " << splits;
        }
        for (int64_t h = 0; h < c.h; ++h) ASSERT_EQ(std::isnan(l[bi * c.h + h]), bi != 1);
      }
      EXPECT_EQ(dflag.download<int32_t>()[0], kPagedErrorPageId | kPagedErrorSeqLen);
      CUDA_OK(cudaMemset(dflag.get(), 0, 4));
    }
  }
}

// A varlen q whose cu_seqlens_q lies (decreasing, past total_q) is clamped on the device (no row
// outside q is touched) and reported in the error flag.
TEST(PagedDecodeGpu, UncheckedBadCuSeqlensAreFlagged) {
  SKIP_WITHOUT_GPU();
  Config c;
  c.h = 8;
  c.h_kv = 2;
  c.lens = {100, 50};
  c.varlen = true;
  c.s_q = 2;  // chunks of 2 and 1 queries: cu_seqlens_q {0, 2, 3}
  const Cache cache = make_cache(c);
  const Query x = make_query(c, 11);
  const int64_t b = 2, tq = x.total_q;
  Dev dpool(cache.pool), dglob(std::vector<float>{cache.globals[0], cache.globals[1]});
  Dev dbt(cache.block_tables), dsl(cache.seq_lens), dq(x.q), dflag(4, 0);
  Dev dout(tq * c.h * c.d * 2, 0), dcu(std::vector<int32_t>{0, 2, 7});  // ends past total_q 3
  ASSERT_TRUE(dpool.ok() && dglob.ok() && dbt.ok() && dsl.ok() && dq.ok() && dflag.ok() &&
              dout.ok() && dcu.ok());
  PagedAttentionCudaOptions copt;
  copt.error_flag = reinterpret_cast<int32_t*>(dflag.get());
  const Status st = paged_attention_cuda(
      make_view(dq.get(), DType::kBF16, {tq, c.h, c.d}), make_view(dcu.get(), DType::kI32, {b + 1}),
      cache.views(dpool.get(), reinterpret_cast<float*>(dglob.get())),
      make_view(dbt.get(), DType::kI32, {b, cache.max_pages}),
      make_view(dsl.get(), DType::kI32, {b}), {},
      make_view(dout.get(), DType::kBF16, {tq, c.h, c.d}), {}, copt, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(dflag.download<int32_t>()[0], kPagedErrorCuSeqlens);
}

// Bad input: a Status naming the argument, before any CUDA call (fake device pointers, never
// dereferenced; host copies are real). Runs without a GPU too.
TEST(PagedDecodeGpu, BadInputIsRejectedBeforeAnyLaunch) {
  auto* fake = reinterpret_cast<uint8_t*>(uintptr_t{1} << 20);
  const int64_t b = 2, h = 8, h_kv = 2, d = 128, pages = 8, ps = 16, mp = 4;
  auto cache_of = [&](KvCacheFormat f, int64_t dd, uint8_t* base) {
    PagedKvCache c{};
    c.format = f;
    const int64_t row = f == KvCacheFormat::kNvfp4 ? dd / 2 : dd;
    c.k_data = make_view(base, DType::kU8, {pages, ps, h_kv, row});
    c.v_data = make_view(base + (1 << 16), DType::kU8, {pages, ps, h_kv, row});
    if (f == KvCacheFormat::kNvfp4) {
      c.k_scales = make_view(base + (2 << 16), DType::kU8, {pages, ps, h_kv, dd / 16});
      c.v_scales = make_view(base + (3 << 16), DType::kU8, {pages, ps, h_kv, dd / 16});
    }
    c.k_global = make_view(base + (4 << 16), DType::kF32, {1});
    c.v_global = make_view(base + (4 << 16) + 4, DType::kF32, {1});
    return c;
  };
  const PagedKvCache cache = cache_of(KvCacheFormat::kNvfp4, d, fake);
  const TensorView q = make_view(fake, DType::kBF16, {b, 1, h, d});
  const TensorView o = make_view(fake + (5 << 16), DType::kBF16, {b, 1, h, d});
  const TensorView lse = make_view(fake + (6 << 16), DType::kF32, {b, h, 1});
  const TensorView bt = make_view(fake, DType::kI32, {b, mp});
  const TensorView sl = make_view(fake, DType::kI32, {b});
  std::vector<int32_t> bt_ok = {0, 1, -1, -1, 2, 3, 4, -1}, sl_ok = {20, 40};
  std::vector<int32_t> bt_oob = {0, 9, -1, -1, 2, 3, 4, -1}, sl_long = {20, 65};
  auto host = [&](std::vector<int32_t>& t, std::vector<int32_t>& s) {
    PagedAttentionCudaOptions c;
    c.block_tables_host = make_view(t.data(), DType::kI32, {b, mp});
    c.seq_lens_host = make_view(s.data(), DType::kI32, {b});
    return c;
  };
  PagedAttentionOptions opt;
  auto run = [&](const TensorView& qq, const PagedKvCache& cc, const TensorView& oo,
                 const TensorView& ll, const PagedAttentionCudaOptions& co) {
    return paged_attention_cuda(qq, {}, cc, bt, sl, opt, oo, ll, co, nullptr);
  };
  PagedAttentionCudaOptions none;
  PagedAttentionCudaOptions neg;
  neg.num_splits = -1;
  PagedKvCache misaligned = cache;
  misaligned.k_data = make_strided_view(fake + 8, DType::kU8, {pages, ps, h_kv, d / 2},
                                        {ps * h_kv * d / 2, h_kv * d / 2, d / 2, 1});
  PagedKvCache bad_stride = cache;
  bad_stride.v_data = make_strided_view(fake + (1 << 16), DType::kU8, {pages, ps, h_kv, d / 2},
                                        {ps * h_kv * 72, h_kv * 72, 72, 1});
  PagedKvCache huge_head_stride = cache;  // in-page offsets beyond 2^31 (32-bit in the kernel)
  huge_head_stride.k_data = make_strided_view(fake, DType::kU8, {pages, ps, h_kv, d / 2},
                                              {int64_t{1} << 33, 64, int64_t{1} << 31, 1});
  PagedKvCache huge_page_stride = cache;  // page strides >= 2^32 (a 32 x 32-bit product)
  huge_page_stride.v_data = make_strided_view(fake, DType::kU8, {pages, ps, h_kv, d / 2},
                                              {int64_t{1} << 32, h_kv * d / 2, d / 2, 1});
  PagedAttentionCudaOptions small_ws;
  small_ws.num_splits = 4;
  small_ws.workspace = fake;
  small_ws.workspace_bytes = 16;
  PagedAttentionCudaOptions half_host;
  half_host.seq_lens_host = make_view(sl_ok.data(), DType::kI32, {b});
  struct Case {
    const char* what;
    Status st;
    const char* expect;
  };
  const Case cases[] = {
      {"q f32", run(make_view(fake, DType::kF32, {b, 1, h, d}), cache, o, lse, none), "q: dtype"},
      {"o f16", run(q, cache, make_view(fake, DType::kF16, {b, 1, h, d}), lse, none), "o: dtype"},
      {"lse f64", run(q, cache, o, make_view(fake, DType::kF64, {b, h, 1}), none), "lse: dtype"},
      {"head_dim 96",
       run(make_view(fake, DType::kBF16, {b, 1, h, 96}), cache_of(KvCacheFormat::kNvfp4, 96, fake),
           make_view(fake, DType::kBF16, {b, 1, h, 96}), lse, none),
       "head_dim"},
      {"fp8 head_dim 256",
       run(make_view(fake, DType::kBF16, {b, 1, h, 256}), cache_of(KvCacheFormat::kFp8, 256, fake),
           make_view(fake, DType::kBF16, {b, 1, h, 256}), lse, none),
       "head_dim"},
      {"q head_dim", run(make_view(fake, DType::kBF16, {b, 1, h, 64}), cache, o, lse, none), "q:"},
      {"heads",
       run(make_view(fake, DType::kBF16, {b, 1, 7, d}), cache,
           make_view(fake, DType::kBF16, {b, 1, 7, d}), make_view(fake, DType::kF32, {b, 7, 1}),
           none),
       "kv heads"},
      {"o shape", run(q, cache, make_view(fake, DType::kBF16, {b, 2, h, d}), lse, none), "o:"},
      {"lse shape", run(q, cache, o, make_view(fake, DType::kF32, {b, h, 2}), none), "lse"},
      {"misaligned k", run(q, misaligned, o, lse, none), "k_cache"},
      {"v stride", run(q, bad_stride, o, lse, none), "v_cache"},
      {"in-page offsets", run(q, huge_head_stride, o, lse, none), "offsets inside a page"},
      {"page stride", run(q, huge_page_stride, o, lse, none), "page strides below 2^32"},
      {"page id", run(q, cache, o, lse, host(bt_oob, sl_ok)), "block_tables[0, 1]"},
      {"seq_len", run(q, cache, o, lse, host(bt_ok, sl_long)), "seq_lens[1]"},
      {"half host copies", run(q, cache, o, lse, half_host), "copt.block_tables_host"},
      {"num_splits", run(q, cache, o, lse, neg), "copt.num_splits"},
      {"workspace",
       paged_attention_cuda(q, {}, cache, make_view(fake, DType::kI32, {b, 64}), sl, opt, o, lse,
                            small_ws, nullptr),
       "copt.workspace_bytes"},
      {"partials split_size",
       paged_attention_partials_cuda(q, {}, cache, bt, sl, opt, 40,
                                     make_view(fake, DType::kF32, {2, b, h, d}),
                                     make_view(fake, DType::kF32, {2, b, h}), none, nullptr),
       "split_size"},
      {"partials cover",
       paged_attention_partials_cuda(q, {}, cache, bt, sl, opt, 16,
                                     make_view(fake, DType::kF32, {2, b, h, d}),
                                     make_view(fake, DType::kF32, {2, b, h}), none, nullptr),
       "do not cover"},
      {"partials dtype",
       paged_attention_partials_cuda(q, {}, cache, bt, sl, opt, 64,
                                     make_view(fake, DType::kF64, {1, b, h, d}),
                                     make_view(fake, DType::kF64, {1, b, h}), none, nullptr),
       "o_partial"},
      {"combine o shape",
       combine_attention_partials_cuda(make_view(fake, DType::kF32, {2, b, h, d}),
                                       make_view(fake, DType::kF32, {2, b, h}),
                                       make_view(fake, DType::kBF16, {b, h, 64}), {}, nullptr),
       "o: expected shape"},
      {"combine lse dtype",
       combine_attention_partials_cuda(
           make_view(fake, DType::kF32, {2, b, h, d}), make_view(fake, DType::kF32, {2, b, h}),
           make_view(fake, DType::kBF16, {b, h, d}), make_view(fake, DType::kF64, {h, b}), nullptr),
       "lse"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.st.ok()) << c.what;
    EXPECT_NE(c.st.message().find(c.expect), std::string::npos)
        << c.what << ": \"" << c.st.message() << "\" should mention \"" << c.expect << "\"";
  }
  EXPECT_TRUE(cases[0].st.unsupported()) << "F32 q is a valid request the GPU lacks";
  // The split plan: no split for a full machine or short contexts; about two CTAs per SM.
  int64_t n = 0, size = 0;
  paged_attention_split_plan(32, 8, 1, 32768, 0, &n, &size);
  EXPECT_EQ(n * size >= 32768 && size % 64 == 0, true);
  EXPECT_LE(n, 2);
  paged_attention_split_plan(64, 8, 1, 32768, 0, &n, &size);
  EXPECT_EQ(n, 1);
  paged_attention_split_plan(1, 8, 1, 32768, 0, &n, &size);
  EXPECT_EQ(n, 32);
  EXPECT_EQ(size, 1024);
  paged_attention_split_plan(1, 8, 1, 400, 0, &n, &size);
  EXPECT_EQ(n, 1);
  paged_attention_split_plan(2, 2, 1, 1000, 7, &n, &size);
  EXPECT_GE(n * size, 1000);
  EXPECT_EQ(size % 64, 0);
  // The wave model (decode.md 7.9): b = 8 x 8 kv heads = 64 pairs fill one wave of the transposed
  // NVFP4 kernel's 4 x 132 slots with 8 splits, of the 16-row kernel's 2 x 132 with 4.
  EXPECT_EQ(paged_decode_ctas_per_sm(128, true, 4), 4);
  EXPECT_EQ(paged_decode_ctas_per_sm(128, true, 16), 2);
  EXPECT_EQ(paged_decode_ctas_per_sm(128, false, 8), 3);
  paged_attention_split_plan(8, 8, 1, 8192, 0, &n, &size, 4);
  EXPECT_EQ(n, 8);
  EXPECT_EQ(size, 1024);
  paged_attention_split_plan(8, 8, 1, 8192, 0, &n, &size, 2);
  EXPECT_EQ(n, 4);
  paged_attention_split_plan(32, 8, 1, 32768, 0, &n, &size, 4);
  EXPECT_EQ(n, 2);
  paged_attention_split_plan(64, 8, 1, 32768, 0, &n, &size, 4);
  EXPECT_EQ(n, 1);
  // b = 1 fills the machine's 528 slots with the fused combine's cheap splits (7.12).
  paged_attention_split_plan(1, 8, 1, 32768, 0, &n, &size, 4);
  EXPECT_EQ(n, 64);
  EXPECT_EQ(size, 512);
  paged_attention_split_plan(1, 8, 1, 8192, 0, &n, &size, 4);
  EXPECT_EQ(n, 32);
  EXPECT_EQ(size, 256);
  paged_attention_split_plan(1, 8, 1, 1024, 0, &n, &size, 4);
  EXPECT_EQ(n, 4);
  // The workspace: partials (each part 256-byte aligned), then one counter per (row, head), last.
  EXPECT_EQ(paged_attention_workspace_bytes(1, 5, 32, 128), 0u);
  EXPECT_EQ(paged_attention_workspace_bytes(3, 5, 32, 128),
            size_t{3 * 5 * 32 * 128 * 4} + size_t{(3 * 5 * 32 * 4 + 255) / 256 * 256} + 5 * 32 * 4);
  if (::fp4attn::testing::have_gpu()) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace fp4attn
