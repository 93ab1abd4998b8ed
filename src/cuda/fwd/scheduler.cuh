// The forward kernel's persistent tile schedule and its K/V stage ring (producer and consumers
// walk the same sequence).
#pragma once

#include "cuda/fwd/config.h"
#include "cuda/fwd/params.h"

namespace fp4attn::sm90 {

// Keys the CTA's rows may see: [0, n_blocks * N).
template <int N>
__device__ __forceinline__ int key_blocks(const FwdParams& p, int m0) {
  int n_blocks = (p.s_k + N - 1) / N;
  if (p.causal) {
    const int last_row = min(p.s_q, m0 + kBlockM) - 1;
    const int last_key = last_row + p.s_k - p.s_q;  // bottom-right aligned
    n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / N + 1);
  }
  return n_blocks;
}

// Persistent schedule: CTA c takes tiles c, c + gridDim.x, ... Non-causal tiles go head by head
// (the CTAs running together share K/V in L2); causal tiles go longest first (largest m_tile of
// every head, then the next), so that the last wave is short work.
struct Tile {
  int m_tile, head, batch;
};

__device__ __forceinline__ int num_tiles(const FwdParams& p) { return p.m_tiles * p.b * p.h; }

__device__ __forceinline__ Tile tile_at(const FwdParams& p, int t) {
  const int bh_count = p.b * p.h;
  int m_tile, bh;
  if (p.causal) {
    m_tile = p.m_tiles - 1 - t / bh_count;
    bh = t % bh_count;
  } else {
    m_tile = t % p.m_tiles;
    bh = t / p.m_tiles;
  }
  return {m_tile, bh % p.h, bh / p.h};
}

// Position in the K/V stage ring: blocks are numbered across all tiles of the CTA.
struct Ring {
  int it = 0;
  __device__ __forceinline__ int stage(int j) const { return (it + j) % kStages; }
  __device__ __forceinline__ uint32_t parity(int j) const { return ((it + j) / kStages) & 1; }
};

}  // namespace fp4attn::sm90
