// Page addressing of the paged decode: where a key lives (block table -> page, token in page), a
// 16-key tile's page id, and a page's four array bases (K/V data, K/V scales).
#pragma once

#include <cstdint>

#include "cuda/decode/params.h"

namespace fp4attn::paged {

// Where key `key` of sequence b lives: (page, token in page); ok false for a page id outside
// [0, num_pages) (never read).
struct KeyLoc {
  int64_t page;
  int32_t tok;
  bool ok;
};

__device__ __forceinline__ int page_index(const DecodeParams& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}

__device__ __forceinline__ KeyLoc locate_key(const DecodeParams& p, int b, int key) {
  const int pi = page_index(p, key);
  const int32_t page = __ldg(p.block_tables + b * p.bt_s0 + pi * p.bt_s1);
  return {page, key - pi * p.page_size, page >= 0 && page < p.num_pages};
}

// The page id of a pages16 tile starting at key kt (the tile lies in one page), -1 when kt is
// past kend (nothing read). The main loop reads it one tile before the tile's data loads, so that
// a tile's prefetch waits for one memory latency instead of two (block table, then data): the
// NVFP4 kernel was latency-bound at 0.7 TB/s with the lookup in the chain (ncu, b=32, L=32k).
__device__ __forceinline__ int32_t tile_page(const DecodeParams& p, int b, int kt, int kend) {
  if (!p.pages16 || kt >= kend) return -1;
  return __ldg(p.block_tables + b * p.bt_s0 + page_index(p, kt) * p.bt_s1);
}
// The same from the sequence's block-table row, formed once per CTA so that the loop does not
// recompute b * bt_s0 in 64 bits on every tile.
__device__ __forceinline__ int32_t tile_page_row(const DecodeParams& p, const int32_t* bt_row,
                                                 int kt, int kend) {
  if (!p.pages16 || kt >= kend) return -1;
  return __ldg(bt_row + page_index(p, kt) * p.bt_s1);
}

// The four page bases of one page id.
struct PageBases {
  const uint8_t *kd, *ks, *vd, *vs;
};

__device__ __forceinline__ PageBases page_bases(const DecodeParams& p, int64_t page) {
  return {p.k.data + page * p.k.data_s[0], p.k.scales + page * p.k.scales_s[0],
          p.v.data + page * p.v.data_s[0], p.v.scales + page * p.v.scales_s[0]};
}

}  // namespace fp4attn::paged
