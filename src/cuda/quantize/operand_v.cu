// V kernel operand on the GPU (detail::quantize_v_operand_cuda): V [b, s, h_kv, d] BF16/FP16 ->
// V^T data [b, h_kv, d, s_pad] (tokens contiguous, padding 0) and FP32 channel scales
// [b, h_kv, d], byte for byte the host reference (src/reference/operands_host.cc on
// golden::prepare_v; docs/numerics.md §3).
//
// Two kernels (three for fp8-style):
//  * v_stats_kernel (fp8-style recipes, nvfp4-all with a computed s_enc, fp4-direct): a column
//    reduction over all tokens of each (b, h_kv) slice. Per 32-token block of a channel it takes
//    the NaN-propagating max |x| on the 16-bit bits (order-preserving for |x|, NaN above Inf),
//    and accumulates with atomicMax on FP32 bits in scratch memory: the channel amax, the slice
//    amax and the largest *finite* 32-token block amax of the slice (stored + 1, 0 = none).
//    One CTA per (b, h_kv, 32 x 256 / (d / 8) tokens): many CTAs, so that every SM is busy.
//  * v_fp8_finish_kernel (fp8-style): per channel the scale and, in place of the amax, the
//    multiplier 448 / amax (v_operand::fp8_inv_code), so that the main kernel has no division
//    (no slow-path call: 64 registers, 4 CTAs an SM).
//  * v_operand_kernel: one tile of T = 16384 / d tokens x d channels per CTA, no shared memory:
//    each thread owns a register tile of 4 adjacent channels x 16 tokens (fp4-direct: 2 x 32,
//    one 32-token block; a warp is 4 token groups x 8 channel groups), loaded with 8-byte
//    (4-byte) vector loads straight from x, all in flight
//    before the math (tokens past s read as 0), quantized by v_operand::quantize_v_tile
//    (operand_v_unit.cuh, host and device: the E4M3 encodes use the hardware cvt with satfinite,
//    the FP4 rounding an FMA onto the E2M1 grid), and written as 16-byte chunks of its V^T rows;
//    the CTA covers T contiguous bytes of each row, keys permuted inside each 16-token group
//    (operands.h operand_v_key_at: a byte shuffle in registers). Tokens >= s are written as 0.
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
constexpr int kTileElems = 16384;  // tokens x head_dim per v_operand_kernel CTA
constexpr int kStatIters = 1;     // 32-token block rows per v_stats_kernel thread

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

// 63 registers (4 CTAs an SM); one 32-token block row per thread, its 32 loads in flight.
template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, 4) v_stats_kernel(VParams p) {
  constexpr int kVecPerRow = kD / 8;
  constexpr int kBlockRows = kThreads / kVecPerRow;  // 32-token blocks per iteration
  __shared__ uint32_t s_chan[kD];
  __shared__ uint32_t s_fin, s_amax;
  for (int c = threadIdx.x; c < kD; c += kThreads) s_chan[c] = 0;
  if (threadIdx.x == 0) s_fin = s_amax = 0;

  // blockIdx: head fastest (neighbouring CTAs read neighbouring bytes of x), then chunk, batch.
  const int64_t bt = blockIdx.x / p.h, hi = blockIdx.x - bt * p.h;
  const int64_t bi = bt / p.tiles, chunk = bt - bi * p.tiles;
  const int64_t bh = bi * p.h + hi;
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

// One CTA: a tile of T = 16384 / d tokens x d channels; thread = kCh adjacent channels x kTok
// consecutive tokens (kCh * kTok = 64), read straight from global memory into registers
// (kTok vector loads of 2 * kCh bytes, all in flight before the math), quantized by
// v_operand::quantize_v_tile, and written as kTok (or 2 kTok) bytes to each of its kCh V^T rows:
// the CTA writes T contiguous bytes of every row (full 128-byte lines).
// fp8: 64 registers a thread (4 CTAs an SM), the channel divisions being done once by
// v_fp8_finish_kernel; the others 78-80 (3 CTAs; nvfp4-all spills at 64).
template <VMode kMode>
constexpr int kMinBlocks = kMode == VMode::kFp8 ? 4 : 3;

template <VMode kMode, bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kMode>) v_operand_kernel(VParams p) {
  constexpr int kCh = v_operand::kTileCh<kMode>, kTok = v_operand::kTileTok<kMode>;
  constexpr int kW = kCh / 2;          // 32-bit words per token
  constexpr int kG = kD / kCh;         // threads per token row
  constexpr int kT = kThreads / kG * kTok;  // tokens per tile
  static_assert(kT == 16384 / kD && kG <= kThreads);
  constexpr int kBytesPerToken = kMode == VMode::kBf16 ? 2 : 1;
  constexpr int kWords = kTok * kBytesPerToken / 4;  // output words per channel row

  // blockIdx: head fastest (neighbouring CTAs read neighbouring bytes of x), then tile, batch.
  // (32-bit division: blockIdx.x, h and tiles are < 2^31.)
  const uint32_t h32 = static_cast<uint32_t>(p.h), tiles32 = static_cast<uint32_t>(p.tiles);
  const uint32_t bt = blockIdx.x / h32, hi = blockIdx.x - bt * h32;
  const uint32_t bi = bt / tiles32, ti = bt - bi * tiles32;
  const int64_t bh = int64_t{bi} * p.h + hi;
  // Thread -> (channel group cg, token group tg): a warp is kLt token groups x kLc channel
  // groups (channel groups fastest), so that one load instruction reads kLt tokens x kLc * 2 kCh
  // contiguous bytes (whole sectors) and one 16-byte store instruction (kCh = 4) writes
  // kLt * 16 = 64 contiguous bytes of each of kLc V^T rows (whole sectors), instead of 32 rows
  // x 16 bytes (half sectors, completed by other warps) with a whole warp along the channels.
  constexpr int kLc = 8, kLt = 32 / kLc;  // lanes along channels / tokens
  constexpr int kWc = kG / kLc;            // warps along the channels
  static_assert(kG % kLc == 0 && (kThreads / 32) % kWc == 0 && (kThreads / kG) % kLt == 0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int cg = (warp % kWc) * kLc + lane % kLc, tg = (warp / kWc) * kLt + lane / kLc;
  const int64_t tok0 = int64_t{ti} * kT + tg * kTok;  // first token of this thread
  if (tok0 >= p.pitch) return;               // no V^T bytes to write (tail tile)
  const int64_t live64 = p.s - tok0;
  const int live = live64 > kTok ? kTok : (live64 < 0 ? 0 : static_cast<int>(live64));
  const uint16_t* xs =
      p.x + int64_t{bi} * p.stride_b + int64_t{hi} * p.stride_h + tok0 * p.stride_s + cg * kCh;

  // All kTok loads are issued before any math; the pointer walks the tokens (no 64-bit multiply
  // per load).
  uint32_t raw[kTok * kW];
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    if constexpr (kW == 2) {
      uint2 q = make_uint2(0, 0);
      if (i < live) q = __ldcs(reinterpret_cast<const uint2*>(xs));
      raw[i * 2] = q.x;
      raw[i * 2 + 1] = q.y;
    } else {
      uint32_t q = 0;
      if (i < live) q = __ldcs(reinterpret_cast<const unsigned int*>(xs));
      raw[i] = q;
    }
    xs += p.stride_s;
  }

  const int64_t chan0 = bh * kD + cg * kCh;
  uint32_t chan_amax[kCh];
#pragma unroll
  for (int j = 0; j < kCh; ++j) chan_amax[j] = 0;
  if constexpr (kMode == VMode::kFp8) {
    // One 16-byte load (chan0 is a multiple of kCh = 4; the scratch is cudaMallocAsync'd).
    static_assert(kCh == 4);
    const uint4 q = *reinterpret_cast<const uint4*>(p.chan_amax + chan0);
    chan_amax[0] = q.x;
    chan_amax[1] = q.y;
    chan_amax[2] = q.z;
    chan_amax[3] = q.w;
  }
  v_operand::VUnitStats st;
  if constexpr (kMode == VMode::kNvfp4) {
    st.tensor_scale = p.tensor_scale;
    if (p.tensor_scale == 0.f) st.slice_amax = p.slice_amax[bh];
  }
  if constexpr (kMode == VMode::kDirect) st.slice_fin = p.slice_fin[bh];

  uint32_t w[kCh * kWords];
  // fp8: chan_amax holds fp8_inv_code(amax) (v_fp8_finish_kernel), no division here.
  v_operand::quantize_v_tile<kMode, kF16, kCh, kTok, kMode == VMode::kFp8>(raw, live, chan_amax,
                                                                           st, w);

  // V^T key order (operands.h): permute inside each 16-token group before the stores (padding
  // was zeroed in natural order, so it stays 0 wherever it lands).
#pragma unroll
  for (int j = 0; j < kCh; ++j) {
#pragma unroll
    for (int g = 0; g < kTok / 16; ++g) {
      if constexpr (kBytesPerToken == 1) {
        v_operand::permute_keys16_bytes(w + j * kWords + 4 * g);
      } else {
        v_operand::permute_keys16_halves(w + j * kWords + 8 * g);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kCh; ++j) {
    uint8_t* row = static_cast<uint8_t*>(p.data) + ((chan0 + j) * p.pitch + tok0) * kBytesPerToken;
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      // 16-byte chunk k covers tokens tok0 + k * 16 / kBytesPerToken ...; pitch is a multiple
      // of 16 tokens and tok0 of kTok >= 16, so only whole 16-token groups can fall past it.
      if (tok0 + k * (16 / kBytesPerToken) < p.pitch) {
        // Plain (write-back) stores: the CTA's other token groups complete the 128-byte line
        // while it is still in L2 (no evict-first on partially written lines).
        *reinterpret_cast<uint4*>(row + 16 * k) =
            make_uint4(w[j * kWords + 4 * k], w[j * kWords + 4 * k + 1],
                       w[j * kWords + 4 * k + 2], w[j * kWords + 4 * k + 3]);
      }
    }
  }
  // (fp8: the scales come from v_fp8_finish_kernel.)
  if (kMode != VMode::kFp8 && ti == 0 && tg == 0) {
#pragma unroll
    for (int j = 0; j < kCh; ++j) {
      p.scale[chan0 + j] = v_operand::channel_scale<kMode>(chan_amax[j], st);
    }
  }
}

// fp8-style, between the two passes: per channel the scale (amax / 448, from the final amax)
// and, in place of the amax, fp8_inv_code(amax) for v_operand_kernel.
__global__ void v_fp8_finish_kernel(uint32_t* chan_amax, float* scale, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const uint32_t a = chan_amax[i];
  scale[i] = v_operand::channel_scale<VMode::kFp8>(a, v_operand::VUnitStats{});
  chan_amax[i] = __float_as_uint(v_operand::fp8_inv_code(a));
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
    if (mode == VMode::kFp8) {
      const int64_t n = bh * d;
      v_fp8_finish_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
          p.chan_amax, p.scale, n);
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
