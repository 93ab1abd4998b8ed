// The Hopper forward kernel (docs/kernels/fwd_sm90.md has the design and budgets).
//
// One CTA computes 128 query rows of one (batch, head): warpgroup 0 loads Q once and streams
// N-key K / V^T tiles through a kStages-deep TMA pipeline; warpgroups 1 and 2 each own 64 rows
// and run S = Q K^T (wgmma, both operands in shared memory), P against an integer log2 running
// max (every rescale an exact power of two, numerics.md §4; p_gen.cuh), P as E4M3 in registers,
// and O += P V (wgmma, A from registers). Each warpgroup issues the S GEMM of block j together
// with the PV GEMM of block j - 1, so that its softmax overlaps its own PV GEMM, and the two
// warpgroups take turns issuing, so that one's softmax overlaps the other's GEMMs
// (mainloop.cuh); then the epilogue (epilogue.cuh). Persistent: the CTAs walk the tiles of
// scheduler.cuh.
#pragma once

#include "cuda/fwd/config.h"
#include "cuda/fwd/epilogue.cuh"
#include "cuda/fwd/mainloop.cuh"
#include "cuda/fwd/p_gen.cuh"
#include "cuda/fwd/params.h"
#include "cuda/fwd/scheduler.cuh"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90 {

// The production kernels record nothing; the P-dump test build (fwd_dump_p.cu) passes a Dump
// that writes each block's P operand bytes and running reference to global memory.
struct NoPDump {
  static constexpr bool kOn = false;
};

template <int D, int PM, int N, bool kS8, class Dump>
__device__ void consume(const FwdParams& p, FwdSmem<D, PM, N>& sm, int cw, const Dump& dump) {
  Ring ring;
  int q_uses = 0;
  for (int t = blockIdx.x; t < num_tiles(p); t += gridDim.x) {
    const Tile tile = tile_at(p, t);
    const int n_blocks = key_blocks<N>(p, tile.m_tile * kBlockM);
    consume_tile<D, PM, N, kS8>(p, sm, cw, tile.batch, tile.head, tile.head / (p.h / p.h_kv),
                                tile.m_tile, n_blocks, ring, q_uses, dump);
    ring.it += n_blocks;
    q_uses += n_blocks > 0;
  }
  // The CTA's shared memory must outlive the last TMA store's reads.
  if (p.o_tma && threadIdx.x % 128 == 0) bulk_wait_read();
}

// The kernel body, shared by the production kernel and the P-dump kernel of the tests. kS8: Q and
// K are INT8 (the int8 recipes), else E4M3.
template <int D, int PM, int N, bool kS8 = false, class Dump>
__device__ __forceinline__ void fwd_body(const FwdParams& p, const Dump& dump) {
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<FwdSmem<D, PM, N>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                   ~uintptr_t(1023));
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    mbar_init(&sm.q_empty, 8);  // one arrival per consumer warp
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 8);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  if constexpr (ones_sum<PM>()) {  // the ones rows after every V^T box, read by the PV wgmma
    constexpr int kOnesBytes = ones_bytes<PM>();
    for (int i = threadIdx.x; i < kStages * (N / kScaleTile) * kOnesBytes / 4; i += kThreads) {
      const int box = i / (kOnesBytes / 4), word = i % (kOnesBytes / 4);
      reinterpret_cast<uint32_t*>(sm.v[box / (N / kScaleTile)][box % (N / kScaleTile)] +
                                  D * kScaleTile)[word] = 0x38383838u;  // E4M3 1.0
    }
    fence_async_shared();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<24>();  // frees 128 x 144 registers: exactly what the consumers add
    if (threadIdx.x == 0) produce<D, PM, N>(p, sm);
  } else {
    setmaxnreg_inc<240>();
    consume<D, PM, N, kS8>(p, sm, wg - 1, dump);
  }
}

// Persistent: gridDim.x CTAs (at most one per SM) walk the tiles of tile_at().
template <int D, int PM, int N, bool kS8>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams p) {
  fwd_body<D, PM, N, kS8>(p, NoPDump{});
}

}  // namespace fp4attn::sm90
