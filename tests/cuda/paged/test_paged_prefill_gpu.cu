// GPU paged prefill (paged_prefill_cuda.h) on the same cache bytes as its host models: the cache
// is written by the host append into host buffers and copied byte for byte to the device.
//  * Repack: the workspace written by paged_prefill_repack_cuda equals paged_prefill_repack_host
//    byte for byte (both start from the same poison, so untouched bytes must match too), guards
//    after the workspace intact.
//  * Output vs the same-numerics golden (golden_paged_prefill: this host repack, Q by
//    quantize_operand_host, the golden forward on those operands): the forward engine tests'
//    tolerance (tests/cuda/test_fwd_gpu.cu: rel-L2 <= 0.012, 0.04 for outputs under 65536
//    elements; LSE within 2e-3 for >= 98% of rows, within 0.05 everywhere), empty rows O = 0 and
//    LSE = +inf, outputs poisoned with NaN first, a second call (caller workspace) bitwise equal.
//  * Output vs float64 attention on the decoded cache (golden_paged_attention): the bounds of the
//    CPU test PagedPrefillHost.GoldenAgainstFloat64 (fp8 Q: cos >= 0.997, rel-L2 <= 0.07; nvfp4
//    Q: 0.99 / 0.12): the golden itself is measured there at 0.9989-0.9994 / 0.034-0.047 (fp8 Q)
//    and the GPU is within 0.012 rel-L2 of the golden.
// Cases: shuffled page ids, shared pages (prefix caching), page sizes 16 and 64, ragged lengths
// with a chunk equal to the whole sequence, 1-token chunks, an empty sequence, runs of equal
// lengths (one engine launch for several sequences), GQA 32/8 and 4/1, d 64 and 128, NVFP4 and
// FP8 caches, fp8 and nvfp4 Q, causal and not. Bad input is rejected before any launch (that test
// needs no GPU). Filter: 'PagedPrefillGpu.*'.
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
#include "fp4attn/golden/paged_prefill.h"
#include "fp4attn/paged_prefill_cuda.h"
#include "harness/metrics.h"
#include "support/gpu_test_util.h"
#include "support/paged_kv_util.h"

namespace fp4attn {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

using paged_test::OwnedCache;
using testing::GuardedBuffer;

struct Case {
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  int64_t page_size = 16, d = 128, h = 32, h_kv = 8;
  std::vector<int32_t> lens = {1, 17, 0, 300, 1000, 1000, 1000};
  std::vector<int32_t> n_q = {1, 1, 0, 300, 1000, 200, 200};
  Recipe q_recipe = Recipe::kFp8;
  bool causal = true;
  uint32_t seed = 1;
  std::string str() const {
    std::string s = std::string(kv_cache_format_name(format)) + " ps " + std::to_string(page_size) +
                    " d " + std::to_string(d) + " h " + std::to_string(h) + "/" +
                    std::to_string(h_kv) + " q " + recipe_name(q_recipe) +
                    (causal ? " causal" : " non-causal") + " lens/n_q";
    for (size_t i = 0; i < lens.size(); ++i)
      s += " " + std::to_string(lens[i]) + "/" + std::to_string(n_q[i]);
    return s;
  }
};

// Host cache (sequence i >= 1 shares the full pages of sequence i - 1 when both are at least
// 256 tokens long: prefix caching), page table, queries.
struct Host {
  Case c;
  OwnedCache cache;
  std::vector<int32_t> table, cu_q;
  int64_t max_pages = 0, b = 0, total_q = 0;
  std::vector<uint16_t> q;
  explicit Host(const Case& x) : c(x), cache(x.format, 1, x.page_size, x.h_kv, x.d) {}
};

void build(Host* x) {
  const Case& c = x->c;
  const int64_t ps = c.page_size;
  x->b = static_cast<int64_t>(c.lens.size());
  int64_t need = 0;
  for (int32_t l : c.lens) {
    need += (l + ps - 1) / ps;
    x->max_pages = std::max<int64_t>(x->max_pages, (l + ps - 1) / ps);
  }
  x->max_pages += 1;
  x->cache = OwnedCache(c.format, need + 2, ps, c.h_kv, c.d);
  std::vector<int32_t> perm(need + 2);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(c.seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  x->table.assign(x->b * x->max_pages, -1);
  size_t next = 0;
  std::vector<int32_t> slots;
  std::vector<float> k, v;
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t bi = 0; bi < x->b; ++bi) {
    const int64_t pages = (c.lens[bi] + ps - 1) / ps;
    int64_t shared = 0;
    if (bi > 0 && c.lens[bi] >= 256 && c.lens[bi - 1] >= 256) {
      shared = std::min<int64_t>(128 / ps, pages - 1);
      for (int64_t p = 0; p < shared; ++p)
        x->table[bi * x->max_pages + p] = x->table[(bi - 1) * x->max_pages + p];
    }
    for (int64_t p = shared; p < pages; ++p) x->table[bi * x->max_pages + p] = perm.at(next++);
    for (int64_t j = shared * ps; j < c.lens[bi]; ++j) {
      slots.push_back(
          static_cast<int32_t>(paged_kv_slot(x->table[bi * x->max_pages + j / ps], ps, j % ps)));
      for (int64_t e = 0; e < c.h_kv * c.d; ++e) {
        k.push_back(normal(rng) + 0.5f * std::sin(0.37f * float(e % c.d)));
        v.push_back(normal(rng));
      }
    }
  }
  const int64_t n = static_cast<int64_t>(slots.size());
  const Status st = paged_kv_append(make_view(k.data(), DType::kF32, {n, c.h_kv, c.d}),
                                    make_view(v.data(), DType::kF32, {n, c.h_kv, c.d}),
                                    make_view(slots.data(), DType::kI32, {n}), x->cache.view());
  ASSERT_TRUE(st.ok()) << st.message();
  x->cu_q.assign(1, 0);
  for (int32_t s : c.n_q) x->cu_q.push_back(x->cu_q.back() + s);
  x->total_q = x->cu_q.back();
  x->q.resize(x->total_q * c.h * c.d);
  for (auto& e : x->q) e = float_to_bf16_bits(normal(rng));
}

template <typename T>
void upload(GuardedBuffer& g, const std::vector<T>& v) {
  if (!v.empty()) {
    ASSERT_EQ(cudaMemcpy(g.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
}

// Device copies of the cache and indices.
struct Device {
  GuardedBuffer kd, vd, ks, vs, g, table, lens, cu, q;
  explicit Device(const Host& x)
      : kd(x.cache.kd),
        vd(x.cache.vd),
        ks(std::max<size_t>(x.cache.ks.size(), 16)),
        vs(std::max<size_t>(x.cache.vs.size(), 16)),
        g(std::vector<float>{x.cache.kg, x.cache.vg}),
        table(x.table),
        lens(x.c.lens),
        cu(x.cu_q),
        q(std::max<size_t>(x.q.size() * 2, 16)) {
    upload(ks, x.cache.ks);
    upload(vs, x.cache.vs);
    upload(q, x.q);
  }
  PagedKvCache view(const Host& x) {
    const Case& c = x.c;
    const int64_t np = x.cache.num_pages, row = x.cache.data_dim();
    PagedKvCache v;
    v.format = c.format;
    v.k_data = make_view(kd.get(), DType::kU8, {np, c.page_size, c.h_kv, row});
    v.v_data = make_view(vd.get(), DType::kU8, {np, c.page_size, c.h_kv, row});
    if (c.format == KvCacheFormat::kNvfp4) {
      v.k_scales = make_view(ks.get(), DType::kU8, {np, c.page_size, c.h_kv, c.d / 16});
      v.v_scales = make_view(vs.get(), DType::kU8, {np, c.page_size, c.h_kv, c.d / 16});
    }
    v.k_global = make_view(g.get(), DType::kF32, {1});
    v.v_global = make_view(g.get() + 4, DType::kF32, {1});
    return v;
  }
};

TensorView i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return make_view(const_cast<int32_t*>(v.data()), DType::kI32, shape);
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.str());
  Host x(c);
  build(&x);
  if (::testing::Test::HasFailure()) return;
  Device dev(x);
  const int64_t b = x.b, tq = x.total_q, h = c.h, d = c.d;
  const TensorView bt_host = i32(x.table, {b, x.max_pages});
  const TensorView bt_dev = make_view(dev.table.get(), DType::kI32, {b, x.max_pages});
  PagedPrefillLayout lay;
  ASSERT_TRUE(
      paged_prefill_layout(i32(x.cu_q, {b + 1}), i32(c.lens, {b}), h, c.h_kv, d, &lay).ok());

  // ---- repack bytes ----
  {
    GuardedBuffer ws(static_cast<size_t>(lay.bytes));
    ASSERT_TRUE(ws.ok());
    const Status st =
        paged_prefill_repack_cuda(dev.view(x), bt_dev, bt_host, lay, ws.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = ws.payload("repack workspace");
    std::vector<uint8_t> want(static_cast<size_t>(lay.bytes), testing::kPoison);
    ASSERT_TRUE(paged_prefill_repack_host(x.cache.view(), bt_host, lay, want.data()).ok());
    ASSERT_EQ(got.size(), want.size());
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << "first differing byte " << first << " (k_data at " << lay.k_data
                         << ", k_scale " << lay.k_scale << ", v_data " << lay.v_data << ", v_scale "
                         << lay.v_scale << ")";
  }

  // ---- the whole prefill, twice ----
  PagedAttentionOptions opt;
  opt.causal = c.causal;
  PagedPrefillCudaOptions copt;
  copt.block_tables_host = bt_host;
  copt.seq_lens_host = i32(c.lens, {b});
  copt.cu_seqlens_q_host = i32(x.cu_q, {b + 1});
  copt.q_recipe = c.q_recipe;
  const size_t n_o = static_cast<size_t>(tq * h * d), n_lse = static_cast<size_t>(h * tq);
  GuardedBuffer o1(std::vector<uint16_t>(n_o, 0xFFFF)), o2(std::vector<uint16_t>(n_o, 0xFFFF));
  GuardedBuffer l1(std::vector<uint32_t>(n_lse, 0xFFFFFFFFu)),
      l2(std::vector<uint32_t>(n_lse, 0xFFFFFFFFu));
  const TensorView qv = make_view(dev.q.get(), DType::kBF16, {tq, h, d});
  const TensorView cu_dev = make_view(dev.cu.get(), DType::kI32, {b + 1});
  const TensorView lens_dev = make_view(dev.lens.get(), DType::kI32, {b});
  Status st = paged_prefill_cuda(qv, cu_dev, dev.view(x), bt_dev, lens_dev, opt,
                                 make_view(o1.get(), DType::kBF16, {tq, h, d}),
                                 make_view(l1.get(), DType::kF32, {h, tq}), copt, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  GuardedBuffer ws(static_cast<size_t>(lay.bytes));
  copt.workspace = ws.get();
  copt.workspace_bytes = static_cast<size_t>(lay.bytes);
  st = paged_prefill_cuda(qv, cu_dev, dev.view(x), bt_dev, lens_dev, opt,
                          make_view(o2.get(), DType::kBF16, {tq, h, d}),
                          make_view(l2.get(), DType::kF32, {h, tq}), copt, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> ob1 = o1.payload("o"), ob2 = o2.payload("o (workspace)");
  const std::vector<uint8_t> lb1 = l1.payload("lse"), lb2 = l2.payload("lse (workspace)");
  EXPECT_TRUE(ob1 == ob2) << "second call differs";
  EXPECT_TRUE(lb1 == lb2) << "second call's LSE differs";
  ws.payload("workspace");  // guards
  std::vector<double> o(n_o), lse(n_lse);
  for (size_t i = 0; i < n_o; ++i) {
    o[i] = bf16_bits_to_float(static_cast<uint16_t>(ob1[2 * i] | (ob1[2 * i + 1] << 8)));
  }
  for (size_t i = 0; i < n_lse; ++i) {
    float f;
    std::memcpy(&f, &lb1[4 * i], 4);
    lse[i] = f;
  }

  // ---- vs the same-numerics golden ----
  std::vector<double> og(n_o), lg(n_lse), o64(n_o), l64(n_lse);
  st = golden_paged_prefill(make_view(x.q.data(), DType::kBF16, {tq, h, d}), i32(x.cu_q, {b + 1}),
                            x.cache.view(), bt_host, i32(c.lens, {b}), opt, c.q_recipe,
                            make_view(og.data(), DType::kF64, {tq, h, d}),
                            make_view(lg.data(), DType::kF64, {h, tq}));
  ASSERT_TRUE(st.ok()) << st.message();
  const ErrorStats eg = compare(o.data(), og.data(), static_cast<int64_t>(n_o));
  EXPECT_EQ(eg.nan_mismatch, 0) << to_string(eg);
  EXPECT_LE(eg.rel_l2, n_o < 65536 ? 0.04 : 0.012) << "vs golden: " << to_string(eg);
  int64_t lse_out = 0, rows = 0;
  double lse_max = 0;
  for (size_t i = 0; i < n_lse; ++i) {
    if (std::isinf(lg[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] > 0) << "lse " << i;
      continue;
    }
    ++rows;
    const double e = std::fabs(lse[i] - lg[i]);
    lse_max = std::max(lse_max, e);
    lse_out += e > 2e-3;
  }
  EXPECT_LE(lse_out, rows / 50) << "LSE rows beyond 2e-3";
  EXPECT_LE(lse_max, 0.05);
  for (int64_t i = 0; i < b; ++i) {  // rows without keys (n_q > L): O = 0
    for (int64_t r = 0; r < c.n_q[i] - c.lens[i]; ++r) {
      for (int64_t e = 0; e < h * d; ++e) EXPECT_EQ(o[(x.cu_q[i] + r) * h * d + e], 0.0);
    }
  }

  // ---- vs float64 on the decoded cache ----
  st = golden_paged_attention(make_view(x.q.data(), DType::kBF16, {tq, h, d}), i32(x.cu_q, {b + 1}),
                              x.cache.view(), bt_host, i32(c.lens, {b}), opt,
                              make_view(o64.data(), DType::kF64, {tq, h, d}),
                              make_view(l64.data(), DType::kF64, {h, tq}));
  ASSERT_TRUE(st.ok()) << st.message();
  const ErrorStats e64 = compare(o.data(), o64.data(), static_cast<int64_t>(n_o));
  const bool fp8q = c.q_recipe == Recipe::kFp8;
  EXPECT_GE(e64.cos, fp8q ? 0.997 : 0.99) << "vs f64: " << to_string(e64);
  EXPECT_LE(e64.rel_l2, fp8q ? 0.07 : 0.12) << "vs f64: " << to_string(e64);
  std::printf("[paged prefill] %s\n  vs golden: %s lse max %.2g (%lld/%lld > 2e-3)\n  vs f64: %s\n",
              c.str().c_str(), to_string(eg).c_str(), lse_max, static_cast<long long>(lse_out),
              static_cast<long long>(rows), to_string(e64).c_str());
}

TEST(PagedPrefillGpu, Nvfp4Gqa32x8D128Page16) {
  SKIP_WITHOUT_GPU();
  check_case(Case{});
}

TEST(PagedPrefillGpu, Fp8Gqa32x8D128Page64) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.format = KvCacheFormat::kFp8;
  c.page_size = 64;
  check_case(c);
}

TEST(PagedPrefillGpu, Gqa4x1D64BothFormatsAndPageSizes) {
  SKIP_WITHOUT_GPU();
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int64_t ps : {16, 64}) {
      Case c;
      c.format = f;
      c.page_size = ps;
      c.d = 64;
      c.h = 4;
      c.h_kv = 1;
      c.lens = {2049, 1, 129, 700, 64};
      c.n_q = {2049, 1, 3, 1, 64};
      c.seed = static_cast<uint32_t>(ps) + (f == KvCacheFormat::kFp8 ? 100 : 0);
      check_case(c);
    }
  }
}

TEST(PagedPrefillGpu, Nvfp4QueryAndNonCausal) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_recipe = Recipe::kNvfp4;
  c.d = 64;
  check_case(c);
  Case n;
  n.causal = false;
  n.format = KvCacheFormat::kFp8;
  n.h = 4;
  n.h_kv = 1;
  check_case(n);
}

// Rejected before any launch (runs without a GPU: the checks touch host memory only, and the
// "device" pointers below are never dereferenced).
TEST(PagedPrefillGpu, BadInputRejectedBeforeLaunch) {
  Case c;
  c.lens = {40, 17};
  c.n_q = {40, 1};
  c.d = 64;
  c.h = 4;
  c.h_kv = 1;
  Host x(c);
  build(&x);
  const int64_t b = x.b, tq = x.total_q, h = c.h, d = c.d;
  std::vector<uint16_t> o(tq * h * d);
  std::vector<float> lse(h * tq);
  std::vector<int32_t> table = x.table, lens = c.lens, cu = x.cu_q;
  PagedKvCache cache = x.cache.view();
  PagedPrefillCudaOptions copt;
  copt.block_tables_host = i32(table, {b, x.max_pages});
  copt.seq_lens_host = i32(lens, {b});
  copt.cu_seqlens_q_host = i32(cu, {b + 1});
  const TensorView qv = make_view(x.q.data(), DType::kBF16, {tq, h, d});
  const TensorView ov = make_view(o.data(), DType::kBF16, {tq, h, d});
  const TensorView lv = make_view(lse.data(), DType::kF32, {h, tq});
  auto run = [&](const TensorView& q, const TensorView& out, const TensorView& l,
                 const PagedKvCache& kv, const PagedPrefillCudaOptions& co) {
    return paged_prefill_cuda(q, i32(cu, {b + 1}), kv, i32(table, {b, x.max_pages}), i32(lens, {b}),
                              PagedAttentionOptions{}, out, l, co, nullptr);
  };
  auto expect = [](const Status& st, const char* needle) {
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  {
    PagedPrefillCudaOptions co = copt;
    co.seq_lens_host = TensorView{};
    expect(run(qv, ov, lv, cache, co), "copt.seq_lens_host");
  }
  {
    PagedPrefillCudaOptions co = copt;
    co.q_recipe = Recipe::kMxfp4;
    expect(run(qv, ov, lv, cache, co), "copt.q_recipe");
  }
  {
    PagedPrefillCudaOptions co = copt;
    co.workspace = o.data();
    co.workspace_bytes = 16;
    expect(run(qv, ov, lv, cache, co), "copt.workspace_bytes");
  }
  expect(run(make_view(x.q.data(), DType::kBF16, {1, tq, h, d}), ov, lv, cache, copt), "q");
  expect(run(qv, make_view(o.data(), DType::kBF16, {tq, h, d - 16}), lv, cache, copt), "o");
  expect(run(qv, ov, make_view(lse.data(), DType::kF64, {h, tq / 2}), cache, copt), "lse");
  {
    std::vector<int32_t> t2 = table;
    t2[1] = 999;
    PagedPrefillCudaOptions co = copt;
    co.block_tables_host = i32(t2, {b, x.max_pages});
    expect(run(qv, ov, lv, cache, co), "block_tables[0, 1]");
  }
  {
    std::vector<int32_t> l2 = lens;
    l2[1] = 10000;
    PagedPrefillCudaOptions co = copt;
    co.seq_lens_host = i32(l2, {b});
    expect(run(qv, ov, lv, cache, co), "seq_lens[1]");
  }
  {
    std::vector<int32_t> c2 = cu;
    c2[1] = 50;
    PagedPrefillCudaOptions co = copt;
    co.cu_seqlens_q_host = i32(c2, {b + 1});
    expect(run(qv, ov, lv, cache, co), "cu_seqlens_q");
  }
  {
    PagedKvCache bad = cache;
    bad.k_data = make_strided_view(x.cache.kd.data() + 4, DType::kU8,
                                   {x.cache.num_pages, c.page_size, c.h_kv, d / 2},
                                   {c.page_size * c.h_kv * d / 2, c.h_kv * d / 2, d / 2, 1});
    expect(run(qv, ov, lv, bad, copt), "k_cache");
  }
  {
    PagedKvCache bad = cache;
    bad.v_scales = TensorView{};
    expect(run(qv, ov, lv, bad, copt), "v_scales");
  }
}

}  // namespace
}  // namespace fp4attn
