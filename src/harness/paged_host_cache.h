// Host helpers for the paged KV cache (tests and the CLI's `fp4attn decode`): an owning cache,
// random inputs, random page tables.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "fp4attn/golden/paged_kv.h"

namespace fp4attn::paged_host {

// Buffers of one layer's cache; untouched bytes keep the sentinel so that stray writes show.
struct OwnedCache {
  static constexpr uint8_t kSentinel = 0xAB;
  KvCacheFormat format;
  int64_t num_pages, page_size, kv_heads, d;
  std::vector<uint8_t> kd, vd, ks, vs;
  float kg = 0, vg = 0;

  OwnedCache(KvCacheFormat f, int64_t pages, int64_t ps, int64_t hkv, int64_t dim)
      : format(f), num_pages(pages), page_size(ps), kv_heads(hkv), d(dim) {
    const int64_t tokens = pages * ps * hkv;
    kd.assign(tokens * data_dim(), kSentinel);
    vd.assign(tokens * data_dim(), kSentinel);
    if (f == KvCacheFormat::kNvfp4) {
      ks.assign(tokens * d / 16, kSentinel);
      vs.assign(tokens * d / 16, kSentinel);
    }
  }
  int64_t data_dim() const { return format == KvCacheFormat::kNvfp4 ? d / 2 : d; }

  PagedKvCache view(Nvfp4ScaleRule rule = Nvfp4ScaleRule::kNearest) {
    PagedKvCache c;
    c.format = format;
    c.rule = rule;
    c.k_data = make_view(kd.data(), DType::kU8, {num_pages, page_size, kv_heads, data_dim()});
    c.v_data = make_view(vd.data(), DType::kU8, {num_pages, page_size, kv_heads, data_dim()});
    if (format == KvCacheFormat::kNvfp4) {
      c.k_scales = make_view(ks.data(), DType::kU8, {num_pages, page_size, kv_heads, d / 16});
      c.v_scales = make_view(vs.data(), DType::kU8, {num_pages, page_size, kv_heads, d / 16});
    }
    c.k_global = make_view(&kg, DType::kF32, {1});
    c.v_global = make_view(&vg, DType::kF32, {1});
    return c;
  }
};

inline std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// A batch laid out over randomly permuted pages: block_tables [b, max_pages] (unused entries
// -1) and the slot of every (sequence, position).
struct PageTable {
  int64_t b, max_pages, page_size;
  std::vector<int32_t> table, lens;
  int32_t slot(int64_t bi, int64_t j) const {
    return static_cast<int32_t>(
        paged_kv_slot(table[bi * max_pages + j / page_size], page_size, j % page_size));
  }
};

inline PageTable random_pages(const std::vector<int32_t>& lens, int64_t page_size,
                              int64_t num_pages, uint32_t seed) {
  PageTable t{static_cast<int64_t>(lens.size()), 0, page_size, {}, lens};
  for (int32_t l : lens)
    t.max_pages = std::max<int64_t>(t.max_pages, (l + page_size - 1) / page_size);
  t.max_pages += 1;  // a spare column that is never read
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  t.table.assign(t.b * t.max_pages, -1);
  size_t next = 0;
  for (int64_t bi = 0; bi < t.b; ++bi) {
    for (int64_t p = 0; p < (lens[bi] + page_size - 1) / page_size; ++p) {
      t.table[bi * t.max_pages + p] = perm.at(next++);
    }
  }
  return t;
}

}  // namespace fp4attn::paged_host
