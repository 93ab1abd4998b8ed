// The paged prefill gather/repack kernel: cached K/V pages of each sequence -> the forward
// engine's contiguous operands (layout of paged_prefill.h), the bytes of
// paged_prefill_repack_host.
//
// One CTA per (128-token tile of a sequence, kv head), 256 threads, two passes over the tile:
//  * K: one thread per (token, 16-channel block), 8 threads per token at d = 128: 8-byte (NVFP4)
//    or 16-byte (FP8) loads of a token row and 16-byte stores of its operand row (coalesced both
//    ways). NVFP4 blocks fold through a per-block byte table (prefill_bits.h).
//  * V: one warp per 16-channel block, one lane per 4 V^T positions (a quad of 4 keys, 2q, 2q+1,
//    2q+8, 2q+9 of a 16-key group): the lane folds its 4 keys' blocks, transposes the 16 x 4 bytes
//    with prmt and stores one 32-bit word per channel; the warp's 32 lanes cover 128 consecutive
//    positions, so each store instruction writes 128 contiguous bytes. No shared memory.
// A page id outside [0, num_pages) is never dereferenced: its tokens become NaN (0x7F) codes.
#include <cuda_runtime.h>

#include <string>

#include "cuda/paged/prefill_bits.h"
#include "cuda/paged/prefill_repack.h"
#include "fp4attn/numerics/paged_kv_codec.h"
#include "fp4attn/paged_prefill.h"

namespace fp4attn::paged {
namespace {

constexpr uint32_t kNanWord = 0x7F7F7F7Fu;

struct Tile {
  int seq;      // sequence within the launch
  int t0;       // first token of the tile
  int len;      // the sequence's cached tokens
  int tile_in;  // tile index inside the sequence
};

// The sequence of CTA tile `tile`: the largest i with cu_tiles[i] <= tile (empty sequences have
// no tiles and are skipped by the search).
__device__ __forceinline__ Tile find_tile(const RepackParams& p, int tile) {
  int lo = 0, hi = p.nseq - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cu_tiles[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  Tile t;
  t.seq = lo;
  t.tile_in = tile - p.cu_tiles[lo];
  t.t0 = t.tile_in * kRepackTileTokens;
  t.len = p.cu_k[lo + 1] - p.cu_k[lo];
  return t;
}

// Byte offset of token `pos`'s (page, offset) in a side's page pool, or -1 for a bad page id.
struct TokenAddr {
  int64_t data, scales;
  bool ok;
};
__device__ __forceinline__ TokenAddr token_addr(const RepackParams& p, const RepackSide& s,
                                                int64_t row, int pos, int head) {
  const int pidx = pos / p.page_size;
  const int off = pos - pidx * p.page_size;
  const int32_t page = __ldg(p.block_tables + row * p.bt_s0 + pidx * p.bt_s1);
  TokenAddr a;
  a.ok = page >= 0 && page < p.num_pages;
  a.data = page * s.data_s[0] + off * s.data_s[1] + head * s.data_s[2];
  a.scales = page * s.scales_s[0] + off * s.scales_s[1] + head * s.scales_s[2];
  return a;
}

// 16 operand bytes of channel block `blk` of one cached token.
template <bool kFp4>
__device__ __forceinline__ void load_block(const RepackSide& s, const TokenAddr& a, int blk,
                                           uint32_t (&out)[4]) {
  if (!a.ok) {
    out[0] = out[1] = out[2] = out[3] = kNanWord;
    return;
  }
  if constexpr (kFp4) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(s.data + a.data + 8 * blk));
    const uint8_t sc = __ldg(s.scales + a.scales + blk);
    fold16(w.x, w.y, sc, out);
  } else {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(s.data + a.data + 16 * blk));
    out[0] = w.x;
    out[1] = w.y;
    out[2] = w.z;
    out[3] = w.w;
  }
}

// The operand factor of a side: 8 / s_enc (NVFP4) or the decode scale (FP8); 0 uncalibrated.
__device__ __forceinline__ float side_factor(const RepackSide& s, bool fp4) {
  return paged_kv_decode_factor(fp4, *s.global, kPagedPrefillFoldDivisor);
}

template <int D, bool kFp4>
__global__ void __launch_bounds__(kRepackThreads)
    prefill_repack_kernel(const __grid_constant__ RepackParams p) {
  constexpr int kBlocks = D / 16;
  const int head = static_cast<int>(blockIdx.y);
  const Tile t = find_tile(p, static_cast<int>(blockIdx.x));
  const int64_t row = p.bt_row0 + t.seq;
  const int n = min(kRepackTileTokens, t.len - t.t0);
  const int pitch = p.cu_v[t.seq + 1] - p.cu_v[t.seq];
  const int tid = static_cast<int>(threadIdx.x);

  // Factors: K per 128-token tile, V per channel (written by the sequence's first tile).
  if (tid == 0) {
    const int tiles = p.cu_tiles[t.seq + 1] - p.cu_tiles[t.seq];
    p.k_scale_out[static_cast<int64_t>(p.cu_tiles[t.seq]) * p.kv_heads +
                  static_cast<int64_t>(head) * tiles + t.tile_in] = side_factor(p.k, kFp4);
  }
  if (t.tile_in == 0 && tid < D) {
    p.v_scale_out[(static_cast<int64_t>(t.seq) * p.kv_heads + head) * D + tid] =
        side_factor(p.v, kFp4);
  }

  // K: operand [kv_heads, len, D] of the sequence.
  uint8_t* k_seq = p.k_out + static_cast<int64_t>(p.cu_k[t.seq]) * p.kv_heads * D +
                   static_cast<int64_t>(head) * t.len * D;
  for (int it = tid; it < kRepackTileTokens * kBlocks; it += kRepackThreads) {
    const int tok = it / kBlocks, blk = it % kBlocks;
    if (tok >= n) break;  // `it` only grows
    const int pos = t.t0 + tok;
    const TokenAddr a = token_addr(p, p.k, row, pos, head);
    uint32_t w[4];
    load_block<kFp4>(p.k, a, blk, w);
    *reinterpret_cast<uint4*>(k_seq + static_cast<int64_t>(pos) * D + 16 * blk) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }

  // V: operand [kv_heads, D, pitch] of the sequence, keys permuted inside 16-key groups.
  uint8_t* v_seq = p.v_out + static_cast<int64_t>(p.cu_v[t.seq]) * p.kv_heads * D +
                   static_cast<int64_t>(head) * D * pitch;
  for (int it = tid; it < 32 * kBlocks; it += kRepackThreads) {
    const int blk = it >> 5, quad = it & 31;
    const int group0 = t.t0 + 16 * (quad >> 2);  // first key of the 16-key group
    if (group0 >= pitch) continue;
    uint32_t x[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int key = group0 + v_quad_key(quad & 3, k);
      if (key < t.len) {
        const TokenAddr a = token_addr(p, p.v, row, key, head);
        load_block<kFp4>(p.v, a, blk, x[k]);
      } else {
        x[k][0] = x[k][1] = x[k][2] = x[k][3] = 0u;  // padding keys
      }
    }
    uint8_t* dst = v_seq + static_cast<int64_t>(16 * blk) * pitch + group0 + 4 * (quad & 3);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t in[4] = {x[0][w], x[1][w], x[2][w], x[3][w]};
      uint32_t out[4];
      transpose4x4(in, out);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<uint32_t*>(dst + static_cast<int64_t>(4 * w + j) * pitch) = out[j];
      }
    }
  }
}

template <int D, bool kFp4>
Status launch(const RepackParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.cu_tiles[p.nseq]), static_cast<unsigned>(p.kv_heads));
  prefill_repack_kernel<D, kFp4><<<grid, kRepackThreads, 0, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("paged_prefill_cuda: repack launch: CUDA error: ") +
                         cudaGetErrorString(e));
}

}  // namespace

Status launch_prefill_repack(const RepackParams& p, bool fp4, int d, cudaStream_t stream) {
  if (p.nseq <= 0 || p.cu_tiles[p.nseq] == 0) return Status::Ok();
  if (d == 128) return fp4 ? launch<128, true>(p, stream) : launch<128, false>(p, stream);
  return fp4 ? launch<64, true>(p, stream) : launch<64, false>(p, stream);
}

}  // namespace fp4attn::paged
