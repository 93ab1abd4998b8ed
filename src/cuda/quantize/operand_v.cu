// V kernel operand on the GPU (detail::quantize_v_operand_cuda): V [b, s, h_kv, d] BF16/FP16 ->
// V^T data [b, h_kv, d, s_pad] (tokens contiguous, padding 0) and FP32 channel scales
// [b, h_kv, d], byte for byte the host reference (src/reference/operands_host.cc on
// golden::prepare_v; docs/numerics.md §3).
//
// Two kernels:
//  * v_stats_kernel (fp8-style recipes, nvfp4-all with a computed s_enc, fp4-direct): a column
//    reduction over all tokens of each (b, h_kv) slice. Per 32-token block of a channel it takes
//    the NaN-propagating max |x| on the 16-bit bits (order-preserving for |x|, NaN above Inf),
//    and accumulates with atomicMax on FP32 bits in scratch memory: the channel amax, the slice
//    amax and the largest *finite* 32-token block amax of the slice (stored + 1, 0 = none).
//  * v_operand_kernel: one tile of T tokens x d channels (T * d = 8192) per CTA, read with
//    16-byte loads into shared memory (tokens past s read as 0), then each thread quantizes 32
//    consecutive tokens of one channel with the FP4ATTN_HD block functions and writes them as
//    16-byte chunks of the V^T row; tokens >= s are written as 0. The per-thread math is
//    v_operand::quantize_v_unit (operand_v_unit.cuh, host and device).
// Recipe rules (golden_operands.cc prepare_v):
//  * bf16: BF16(x) (RNE, NaN quieted as common/half.h), scale 1.
//  * fp8, nvfp4, nvfp4-hx, mxfp4, nvfp4-fast: fp8_quantize_block over all s tokens of a channel.
//  * nvfp4-all: nvfp4_quantize_block (nearest) per 16 tokens, s_enc static or
//    nvfp4_tensor_scale(slice amax); folded E4M3(e2m1 * scale / 8); scale 8 / s_enc.
//  * fp4-direct: direct_v_quantize_block per 32 tokens; t = (exponent of the largest finite block)
//    - 6, the block exponent being monotone in the block amax; E4M3(q * 2^(e - t)), NaN blocks
//    NaN; scale 2^t / 6.
// Zero-padded tails give the same scales and codes as the host's short blocks (amax and the
// codes of the real elements do not change), and padding is masked to 0 on the way out.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "cuda/quantize/operand_v_unit.cuh"
#include "cuda/quantize/validate_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/quantize.h"

namespace fp4attn::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTileElems = 8192;  // tokens x head_dim per v_operand_kernel CTA
constexpr int kStatIters = 8;     // 32-token block rows per v_stats_kernel thread

using v_operand::kNonFinite16;
using v_operand::kUnitTokens;
using v_operand::to_float;
using v_operand::VMode;

struct VParams {
  const uint16_t* x;
  int64_t s, h;
  int64_t stride_b, stride_s, stride_h;  // elements
  int64_t pitch;                         // s_pad
  int64_t tiles;                         // tiles per slice (v_operand_kernel) or chunks (stats)
  void* data;
  float* scale;
  uint32_t* chan_amax;   // [b * h * d] FP32 bits, NaN-propagating
  uint32_t* slice_amax;  // [b * h] FP32 bits, NaN-propagating
  uint32_t* slice_fin;   // [b * h] FP32 bits + 1 of the largest finite 32-token block amax
  float tensor_scale;    // static s_enc (nvfp4-all) or 0
};

// ---- pre-pass: column amax ----------------------------------------------------------------

template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads) v_stats_kernel(VParams p) {
  constexpr int kVecPerRow = kD / 8;
  constexpr int kBlockRows = kThreads / kVecPerRow;  // 32-token blocks per iteration
  __shared__ uint32_t s_chan[kD];
  __shared__ uint32_t s_fin, s_amax;
  for (int c = threadIdx.x; c < kD; c += kThreads) s_chan[c] = 0;
  if (threadIdx.x == 0) s_fin = s_amax = 0;

  const int64_t bh = blockIdx.x / p.tiles, chunk = blockIdx.x - bh * p.tiles;
  const int64_t bi = bh / p.h, hi = bh - bi * p.h;
  const int j = threadIdx.x % kVecPerRow, row = threadIdx.x / kVecPerRow;
  const uint16_t* xs = p.x + bi * p.stride_b + hi * p.stride_h + j * 8;

  uint32_t cmax[4] = {0, 0, 0, 0};  // two channels per word, |x| bits
  uint32_t fin = 0;                 // largest finite block amax (16-bit bits) + 1
  for (int it = 0; it < kStatIters; ++it) {
    const int64_t blk = (chunk * kStatIters + it) * kBlockRows + row;
    const int64_t tok0 = blk * kUnitTokens;
    if (tok0 >= p.s) break;
    uint32_t bm[4] = {0, 0, 0, 0};
#pragma unroll 8
    for (int i = 0; i < kUnitTokens; ++i) {
      if (tok0 + i < p.s) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(xs + (tok0 + i) * p.stride_s));
        bm[0] = __vmaxu2(bm[0], q.x & 0x7FFF7FFFu);
        bm[1] = __vmaxu2(bm[1], q.y & 0x7FFF7FFFu);
        bm[2] = __vmaxu2(bm[2], q.z & 0x7FFF7FFFu);
        bm[3] = __vmaxu2(bm[3], q.w & 0x7FFF7FFFu);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      cmax[k] = __vmaxu2(cmax[k], bm[k]);
      const uint32_t lo = bm[k] & 0xFFFFu, hi16 = bm[k] >> 16;
      if (lo < kNonFinite16<kF16>) fin = max(fin, lo + 1);
      if (hi16 < kNonFinite16<kF16>) fin = max(fin, hi16 + 1);
    }
  }
  __syncthreads();  // shared init
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    atomicMax(&s_chan[j * 8 + 2 * k], cmax[k] & 0xFFFFu);
    atomicMax(&s_chan[j * 8 + 2 * k + 1], cmax[k] >> 16);
  }
  if (fin != 0) atomicMax(&s_fin, fin);
  __syncthreads();
  for (int c = threadIdx.x; c < kD; c += kThreads) {
    const uint32_t bits = __float_as_uint(to_float<kF16>(s_chan[c]));
    atomicMax(&p.chan_amax[bh * kD + c], bits);
    atomicMax(&s_amax, bits);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicMax(&p.slice_amax[bh], s_amax);
    if (s_fin != 0) atomicMax(&p.slice_fin[bh], __float_as_uint(to_float<kF16>(s_fin - 1)) + 1);
  }
}

// ---- main pass: transpose + quantize ----------------------------------------------------------

// CTAs per SM the register budget is sized for (64 registers a thread; fp4-direct holds a
// whole 32-value block and gets 85).
template <VMode kMode>
constexpr int kMinBlocks = kMode == VMode::kDirect ? 3 : 4;

template <VMode kMode, bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kMode>) v_operand_kernel(VParams p) {
  constexpr int kT = kTileElems / kD;  // tokens per tile: 64 (d 128) or 128 (d 64)
  constexpr int kVecPerRow = kD / 8;
  static_assert(kT * kD / (8 * kThreads) * (8 * kThreads) == kT * kD);
  static_assert(kThreads * kUnitTokens == kTileElems);
  __shared__ __align__(16) uint16_t tile[kT * kD];

  const int64_t bh = blockIdx.x / p.tiles, ti = blockIdx.x - bh * p.tiles;
  const int64_t bi = bh / p.h, hi = bh - bi * p.h;
  const int64_t t0 = ti * kT;
  const uint16_t* xs = p.x + bi * p.stride_b + hi * p.stride_h;
#pragma unroll
  for (int k = 0; k < kT * kVecPerRow / kThreads; ++k) {
    const int v = threadIdx.x + k * kThreads;
    const int row = v / kVecPerRow, col = v % kVecPerRow;
    uint4 q = make_uint4(0, 0, 0, 0);
    if (t0 + row < p.s) {
      q = __ldg(reinterpret_cast<const uint4*>(xs + (t0 + row) * p.stride_s + col * 8));
    }
    *reinterpret_cast<uint4*>(&tile[row * kD + col * 8]) = q;
  }
  __syncthreads();

  const int c = threadIdx.x % kD, r0 = (threadIdx.x / kD) * kUnitTokens;
  const int64_t tok0 = t0 + r0;  // first token of this thread's unit
  const int64_t chan = bh * kD + c;
  // Tokens of the unit that are real (the rest are written as 0).
  const int64_t live64 = p.s - tok0;
  const int live = live64 > kUnitTokens ? kUnitTokens : static_cast<int>(live64);
  v_operand::VUnitStats st;
  if constexpr (kMode == VMode::kFp8) st.chan_amax = p.chan_amax[chan];
  if constexpr (kMode == VMode::kNvfp4) {
    st.tensor_scale = p.tensor_scale;
    if (p.tensor_scale == 0.f) st.slice_amax = p.slice_amax[bh];
  }
  if constexpr (kMode == VMode::kDirect) st.slice_fin = p.slice_fin[bh];

  constexpr int kBytesPerToken = kMode == VMode::kBf16 ? 2 : 1;
  constexpr int kChunks = kUnitTokens * kBytesPerToken / 16;  // 16-byte stores
  constexpr int kChunkTokens = 16 / kBytesPerToken;
  uint32_t w[kChunks * 4];
  const float scale = v_operand::quantize_v_unit<kMode, kF16, kD>(&tile[r0 * kD + c], live, st, w);
  uint8_t* row = static_cast<uint8_t*>(p.data) + (chan * p.pitch + tok0) * kBytesPerToken;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    if (tok0 + k * kChunkTokens < p.pitch) {
      *reinterpret_cast<uint4*>(row + 16 * k) =
          make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
  }
  if (ti == 0 && r0 == 0) p.scale[chan] = scale;
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = value;
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("quantize_operand_cuda (V): ") + what +
                         " failed: " + cudaGetErrorString(err));
}

VMode mode_of(Recipe r) {
  switch (r) {
    case Recipe::kBf16:
      return VMode::kBf16;
    case Recipe::kNvfp4All:
      return VMode::kNvfp4;
    case Recipe::kFp4Direct:
      return VMode::kDirect;
    default:
      return VMode::kFp8;
  }
}

template <bool kF16, int kD>
void launch_stats(const VParams& p, int64_t blocks, cudaStream_t stream) {
  v_stats_kernel<kF16, kD><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
}

template <VMode kMode, bool kF16, int kD>
void launch_main(const VParams& p, int64_t blocks, cudaStream_t stream) {
  v_operand_kernel<kMode, kF16, kD><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
}

template <bool kF16, int kD>
void launch_main_for(VMode mode, const VParams& p, int64_t blocks, cudaStream_t stream) {
  switch (mode) {
    case VMode::kBf16:
      return launch_main<VMode::kBf16, kF16, kD>(p, blocks, stream);
    case VMode::kFp8:
      return launch_main<VMode::kFp8, kF16, kD>(p, blocks, stream);
    case VMode::kNvfp4:
      return launch_main<VMode::kNvfp4, kF16, kD>(p, blocks, stream);
    case VMode::kDirect:
      return launch_main<VMode::kDirect, kF16, kD>(p, blocks, stream);
  }
}

}  // namespace

Status quantize_v_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                               const TensorView& data, const TensorView& scale,
                               cudaStream_t stream) {
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  const int64_t bh = b * h;
  const VMode mode = mode_of(recipe);
  const bool f16 = x.dtype == DType::kF16;
  if (bh == 0) return Status::Ok();

  if (s == 0) {
    // No tokens: only the channel scales, as the host writes them.
    float value = 1.f;  // bf16; fp8-style (amax 0)
    if (mode == VMode::kNvfp4) {
      const float s_enc = opt.tensor_scale != 0.f
                              ? opt.tensor_scale
                              : nvfp4_tensor_scale(0.f, Nvfp4ScaleRule::kNearest);
      value = 8.f / s_enc;
    } else if (mode == VMode::kDirect) {
      value = 1.f / 6.f;  // t = 0
    }
    const int64_t n = bh * d;
    fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(scale.as<float>(), n,
                                                                            value);
    return cuda_status(cudaGetLastError(), "fill launch");
  }
  // V^T rows are written in 16-byte chunks.
  FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(data.data, "data", 16));

  VParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.s = s;
  p.h = h;
  p.stride_b = x.stride[0];
  p.stride_s = x.stride[1];
  p.stride_h = x.stride[2];
  p.pitch = operand_v_pitch(s);
  p.data = data.data;
  p.scale = scale.as<float>();
  p.tensor_scale = opt.tensor_scale;

  const bool need_stats = mode == VMode::kFp8 || mode == VMode::kDirect ||
                          (mode == VMode::kNvfp4 && opt.tensor_scale == 0.f);
  uint32_t* scratch = nullptr;
  if (need_stats) {
    const int64_t words = bh * d + 2 * bh;
    const size_t bytes = static_cast<size_t>(words) * sizeof(uint32_t);
    FP4ATTN_RETURN_IF_ERROR(cuda_status(
        cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream), "cudaMallocAsync"));
    cudaError_t err = cudaMemsetAsync(scratch, 0, bytes, stream);
    if (err != cudaSuccess) {
      cudaFreeAsync(scratch, stream);
      return cuda_status(err, "cudaMemsetAsync");
    }
    p.chan_amax = scratch;
    p.slice_amax = scratch + bh * d;
    p.slice_fin = scratch + bh * d + bh;
    const int64_t tokens_per_cta = (kThreads / (d / 8)) * kUnitTokens * kStatIters;
    p.tiles = (s + tokens_per_cta - 1) / tokens_per_cta;
    const int64_t blocks = p.tiles * bh;
    if (blocks > INT_MAX) {
      cudaFreeAsync(scratch, stream);
      return Status::Invalid("x: too many (batch, head, token chunk) tiles for one launch");
    }
    if (d == 64) {
      f16 ? launch_stats<true, 64>(p, blocks, stream) : launch_stats<false, 64>(p, blocks, stream);
    } else {
      f16 ? launch_stats<true, 128>(p, blocks, stream)
          : launch_stats<false, 128>(p, blocks, stream);
    }
  }

  const int64_t tile_tokens = kTileElems / d;
  p.tiles = (s + tile_tokens - 1) / tile_tokens;
  const int64_t blocks = p.tiles * bh;
  Status st;
  if (blocks > INT_MAX) {
    st = Status::Invalid("x: too many (batch, head, token tile) tiles for one launch");
  } else {
    if (d == 64) {
      f16 ? launch_main_for<true, 64>(mode, p, blocks, stream)
          : launch_main_for<false, 64>(mode, p, blocks, stream);
    } else {
      f16 ? launch_main_for<true, 128>(mode, p, blocks, stream)
          : launch_main_for<false, 128>(mode, p, blocks, stream);
    }
    st = cuda_status(cudaGetLastError(), "kernel launch");
  }
  if (scratch != nullptr) {
    const Status freed = cuda_status(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
    if (st.ok()) st = freed;
  }
  return st;
}

}  // namespace fp4attn::detail
