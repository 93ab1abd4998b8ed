// V kernel operand on the GPU (detail::quantize_v_operand_cuda): V [b, s, h_kv, d] BF16/FP16 ->
// V^T data [b, h_kv, d, s_pad] (tokens contiguous, padding 0) and FP32 channel scales
// [b, h_kv, d], byte for byte the host reference (src/reference/operands_host.cc on
// golden::prepare_v; docs/numerics.md §3).
//
// This file launches them; two kernels (three for fp8-style):
//  * v_stats_kernel (operand_v_stats.cuh; fp8-style recipes, nvfp4-all with a computed s_enc,
//  fp4-direct): a column
//    reduction over all tokens of each (b, h_kv) slice. Per 32-token block of a channel it takes
//    the NaN-propagating max |x| on the 16-bit bits (order-preserving for |x|, NaN above Inf),
//    and accumulates with atomicMax on FP32 bits in scratch memory: the channel amax, the slice
//    amax and the largest *finite* 32-token block amax of the slice (stored + 1, 0 = none).
//    One CTA per (b, h_kv, 32 x 256 / (d / 8) tokens): many CTAs, so that every SM is busy.
//  * v_fp8_finish_kernel (operand_v_scales.cuh; fp8-style): per channel the scale and, in place of
//  the amax, the
//    multiplier 448 / amax (v_operand::fp8_inv_code), so that the main kernel has no division
//    (no slow-path call: 64 registers, 4 CTAs an SM).
//  * v_operand_kernel (operand_v_tile.cuh): one tile of T = 16384 / d tokens x d channels per CTA,
//  no shared memory:
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

#include "cuda/quantize/operand_v_config.h"
#include "cuda/quantize/operand_v_scales.cuh"
#include "cuda/quantize/operand_v_stats.cuh"
#include "cuda/quantize/operand_v_tile.cuh"
#include "cuda/quantize/operand_v_unit.cuh"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands_cuda.h"
#include "validate/validate_cuda.h"

namespace fp4attn::detail {
namespace v_operand {
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  return sm90::cuda_status(e, "quantize_operand_cuda (V)", what);
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

Status quantize(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                const TensorView& data, const TensorView& scale, cudaStream_t stream) {
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
      v_fp8_finish_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p.chan_amax,
                                                                                      p.scale, n);
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

}  // namespace
}  // namespace v_operand

Status quantize_v_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                               const TensorView& data, const TensorView& scale,
                               cudaStream_t stream) {
  return v_operand::quantize(x, recipe, opt, data, scale, stream);
}

}  // namespace fp4attn::detail
