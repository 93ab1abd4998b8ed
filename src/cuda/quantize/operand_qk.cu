// Q/K kernel operands on the GPU (operands.h layouts): data [b, h, s, d] E4M3 (BF16 for bf16, INT8
// for the int8 recipes), scale FP32 [b, h, ceil(s / 128)], optional K mean [b, h, d]. The bytes
// equal quantize_operand_host's: every rounding goes through the FP4ATTN_HD functions of formats.h
// / quantize.h, in the order of golden_operands.cc. This file launches the passes (all on
// `stream`); the kernels are in the headers named below (docs/kernels/quantize.md).
//
//   1. smooth_k only: the K mean per (b, h, channel), summed in double in token order as
//      golden::smooth_keys, in parallel wherever that is provably exact (launch_k_mean,
//      operand_qk_mean.cu / operand_qk_mean.cuh).
//   2. computed NVFP4 s_enc or mxfp4: slice_max_kernel, a per-(b, h) max over the (smoothed)
//      slice into FP32-sized scratch words: NVFP4: the NaN-propagating amax (max of |x| bits);
//      mxfp4: the largest finite block amax (+1, 0 = none), whose block exponent is the
//      slice's largest (the MX exponent is non-decreasing in the block amax)
//      (operand_qk_slice_max.cuh).
//   3. quantize: one thread per 16-element NVFP4 block (32 for MX, 16 values for bf16), two
//      16-byte loads, the HD block quantizer, the folded E4M3 bytes in 16-byte stores; fp8 and
//      int8: one CTA per 128-token tile (amax over the whole 128 x d tile in shared memory, then
//      codes; operand_qk_fp8.cuh). fold_table_kernel first (operand_qk_tables.cuh); NVFP4:
//      nvfp4_slice_setup_kernel (s_enc, 8 / s_enc and the scale table per slice, so the block
//      kernel has no division), then nvfp4_operand_kernel (up to 8 blocks per thread), and
//      nvfp4_operand_generic_kernel for slices without a finite table (operand_qk_nvfp4.cuh);
//      mxfp4 and bf16: quantize_kernel (operand_qk_mx_bf16.cuh).
//
// Speed (operand_qk_fast.cuh): inputs unpacked without NaN quieting where only NaN-ness matters,
// block amax as packed 16-bit integer maxima, NVFP4 blocks by nvfp4_operand_kernel (a per-CTA
// table of s_enc / scale, exact short scale encodes, packed::four_over_six shared with the packed
// quantizer), MX blocks by packed::mxfp4_block, the fold E4M3(e2m1 * factor) through
// per-scale-code byte tables (fold_table_kernel) selected with PRMT, fp8 codes by the exact
// e4m3x4_finite, the K mean as a plain FP64 chain (recomputed with x86 NaN rules only when NaN).
// Host NaN semantics: operand_qk_host_nan.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_fp8.cuh"
#include "cuda/quantize/operand_qk_launch.h"
#include "cuda/quantize/operand_qk_mx_bf16.cuh"
#include "cuda/quantize/operand_qk_nvfp4.cuh"
#include "cuda/quantize/operand_qk_slice_max.cuh"
#include "cuda/quantize/operand_qk_tables.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/operands_cuda.h"
#include "validate/validate_cuda.h"

namespace fp4attn::detail {
namespace qk_operand {
namespace {

dim3 slice_grid(int64_t blocks_per_slice, int64_t nbh) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(blocks_per_slice, 1, kMaxGridX)),
              static_cast<unsigned>(std::min<int64_t>(nbh, kMaxGridY)));
}

struct Launch {
  XArgs a;
  const float* mean;  // smoothed K: the mean written by pass 1; else null
  cudaStream_t stream;
};

// Whether a static s_enc has a finite table (Nvfp4Slice::fast of nvfp4_slice_setup_kernel).
bool nvfp4_static_fast(float s_enc) { return s_enc > 0.f && packed::nvfp4_table_finite(s_enc); }

// Pass 3 for the NVFP4 rules: nvfp4_slice_setup_kernel (one table for a static s_enc, one per
// slice for computed ones), nvfp4_operand_kernel, and nvfp4_operand_generic_kernel where a slice
// may lack a finite table. slice_max: the slice amaxes when tensor_scale is 0.
template <bool kF16, int kD, Nvfp4ScaleRule kRule>
Status launch_nvfp4_operand(const Launch& l, const uint32_t* slice_max, float tensor_scale,
                            void* data, float* scale) {
  const XArgs& a = l.a;
  const bool computed = tensor_scale == 0.f;
  const int64_t n = computed ? a.nbh : 1;
  const int64_t step = computed ? 1 : 0;
  void* scratch = nullptr;
  const size_t table_offset = static_cast<size_t>(n) * sizeof(Nvfp4Slice);
  FP4ATTN_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&scratch, table_offset + n * 128 * sizeof(float2), l.stream),
                  "cudaMallocAsync"));
  Nvfp4Slice* slices = static_cast<Nvfp4Slice*>(scratch);
  float2* tables = reinterpret_cast<float2*>(static_cast<char*>(scratch) + table_offset);
  nvfp4_slice_setup_kernel<kRule>
      <<<static_cast<unsigned>(n), 128, 0, l.stream>>>(slice_max, tensor_scale, slices, tables);
  Status st = cuda_status(cudaGetLastError(), "nvfp4_slice_setup_kernel launch");
  const int64_t units = a.s * (kD / kNvfp4Block);
  if (st.ok() && (computed || nvfp4_static_fast(tensor_scale))) {
    // Blocks per thread: up to 8 where the grid still gives every SM many CTAs (the setup per
    // CTA and slice is then paid once per 8 blocks, and each step's loads overlap the previous
    // step's math); 1 for small inputs.
    const int64_t threads_needed = a.nbh * ((units + kThreads - 1) / kThreads) * kThreads;
    const int64_t enough =
        int64_t{packed::sm_count()} * 4 * 4 * kThreads;  // SMs x CTAs x waves x threads
    const int64_t per = std::clamp<int64_t>(threads_needed / enough, 1, 8);
    const dim3 grid = slice_grid((units + kThreads * per - 1) / (kThreads * per), a.nbh);
    auto launch = [&](auto kernel, const float* mean) {
      kernel<<<grid, kThreads, 0, l.stream>>>(a, mean, slices, tables, step, data, scale);
    };
    if (l.mean != nullptr) {
      launch(nvfp4_operand_kernel<kF16, kD, kRule, true>, l.mean);
    } else {
      launch(nvfp4_operand_kernel<kF16, kD, kRule, false>, nullptr);
    }
    st = cuda_status(cudaGetLastError(), "nvfp4_operand_kernel launch");
  }
  if (st.ok() && (computed || !nvfp4_static_fast(tensor_scale))) {
    // Few CTAs: with a computed s_enc almost every slice has a table and returns at once.
    const int64_t gx = computed ? std::min<int64_t>((units + kThreads - 1) / kThreads, 4)
                                : (units + kThreads - 1) / kThreads;
    nvfp4_operand_generic_kernel<kF16, kD, kRule>
        <<<slice_grid(gx, a.nbh), kThreads, 0, l.stream>>>(a, l.mean, slices, step, data, scale);
    st = cuda_status(cudaGetLastError(), "nvfp4_operand_generic_kernel launch");
  }
  const Status free_st = cuda_status(cudaFreeAsync(scratch, l.stream), "cudaFreeAsync");
  return st.ok() ? free_st : st;
}

// Passes 2 and 3 for one (dtype, head_dim).
template <bool kF16, int kD>
Status run_passes(const Launch& l, Recipe recipe, float tensor_scale, void* data, float* scale) {
  const XArgs& a = l.a;
  const Recipe op = operand_recipe(recipe);
  if (op == Recipe::kFp8 || op == Recipe::kInt8) {
    const dim3 grid = slice_grid(operand_scale_tiles(a.s), a.nbh);
    uint8_t* d = static_cast<uint8_t*>(data);
    if (op == Recipe::kInt8) {
      tile_kernel<kF16, kD, true><<<grid, kThreads, 0, l.stream>>>(a, l.mean, d, scale);
    } else {
      tile_kernel<kF16, kD, false><<<grid, kThreads, 0, l.stream>>>(a, l.mean, d, scale);
    }
    return cuda_status(cudaGetLastError(), "tile_kernel launch");
  }
  if (recipe == Recipe::kBf16) {
    const int64_t units = a.s * (kD / kNvfp4Block);
    quantize_kernel<kF16, kD, Mode::kBf16, Nvfp4ScaleRule::kNearest>
        <<<slice_grid((units + kThreads - 1) / kThreads, a.nbh), kThreads, 0, l.stream>>>(
            a, l.mean, nullptr, 0.f, data, scale);
    return cuda_status(cudaGetLastError(), "quantize_kernel launch");
  }
  const bool mx = recipe == Recipe::kMxfp4;
  const bool need_max = mx || tensor_scale == 0.f;
  const int blk = mx ? kMxfp4Block : kNvfp4Block;
  const int64_t units = a.s * (kD / blk);
  const dim3 grid = slice_grid((units + kThreads - 1) / kThreads, a.nbh);
  uint32_t* slice_max = nullptr;
  if (need_max) {
    const size_t bytes = static_cast<size_t>(a.nbh) * sizeof(uint32_t);
    FP4ATTN_RETURN_IF_ERROR(cuda_status(
        cudaMallocAsync(reinterpret_cast<void**>(&slice_max), bytes, l.stream), "cudaMallocAsync"));
    Status st = cuda_status(cudaMemsetAsync(slice_max, 0, bytes, l.stream), "cudaMemsetAsync");
    if (st.ok()) {
      if (mx) {
        slice_max_kernel<kF16, kD, true><<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max);
      } else {
        slice_max_kernel<kF16, kD, false><<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max);
      }
      st = cuda_status(cudaGetLastError(), "slice_max_kernel launch");
    }
    if (!st.ok()) {
      cudaFreeAsync(slice_max, l.stream);
      return st;
    }
  }
  fold_table_kernel<<<1, 512, 0, l.stream>>>();
  Status st = Status::Ok();
  switch (recipe) {
    case Recipe::kMxfp4:
      // One kernel: the split MX kernels would take more registers (occupancy) when smoothed.
      quantize_kernel<kF16, kD, Mode::kMx, Nvfp4ScaleRule::kNearest>
          <<<grid, kThreads, 0, l.stream>>>(a, l.mean, slice_max, tensor_scale, data, scale);
      st = cuda_status(cudaGetLastError(), "quantize_kernel launch");
      break;
    case Recipe::kNvfp4Hx:
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kRestricted>(l, slice_max, tensor_scale,
                                                                       data, scale);
      break;
    case Recipe::kFp4Direct:
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kNearest>(l, slice_max, tensor_scale,
                                                                    data, scale);
      break;
    default:  // nvfp4, nvfp4-fast, nvfp4-all: Four-Over-Six
      st = launch_nvfp4_operand<kF16, kD, Nvfp4ScaleRule::kFourOverSix>(l, slice_max, tensor_scale,
                                                                        data, scale);
      break;
  }
  if (slice_max != nullptr) {
    const Status free_st = cuda_status(cudaFreeAsync(slice_max, l.stream), "cudaFreeAsync");
    if (st.ok()) st = free_st;
  }
  return st;
}

}  // namespace
}  // namespace qk_operand

Status quantize_qk_operand_cuda(const TensorView& x, Recipe recipe, const OperandOptions& opt,
                                const TensorView& data, const TensorView& scale,
                                const TensorView& mean, cudaStream_t stream) {
  // The kernels store data in 16-byte vectors and scale / mean as FP32 words.
  if (data.numel() > 0) FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(data.data, "data", 16));
  if (scale.numel() > 0) FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(scale.data, "scale", 4));
  if (opt.smooth_k && mean.numel() > 0) {
    FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(mean.data, "mean", 4));
  }
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3];
  if (b == 0 || h == 0) return Status::Ok();
  const bool f16 = x.dtype == DType::kF16;
  qk_operand::Launch l{
      {static_cast<const uint16_t*>(x.data), x.stride[0], x.stride[1], x.stride[2], s, h, b * h},
      nullptr,
      stream};
  if (opt.smooth_k) {
    float* m = mean.as<float>();
    FP4ATTN_RETURN_IF_ERROR(qk_operand::launch_k_mean(l.a, static_cast<int>(d), f16, m, stream));
    l.mean = m;
  }
  if (s == 0) return Status::Ok();
  float* sc = scale.as<float>();
  using qk_operand::run_passes;
  if (d == 64) {
    return f16 ? run_passes<true, 64>(l, recipe, opt.tensor_scale, data.data, sc)
               : run_passes<false, 64>(l, recipe, opt.tensor_scale, data.data, sc);
  }
  return f16 ? run_passes<true, 128>(l, recipe, opt.tensor_scale, data.data, sc)
             : run_passes<false, 128>(l, recipe, opt.tensor_scale, data.data, sc);
}

}  // namespace fp4attn::detail
