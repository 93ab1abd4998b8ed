// paged_kv_append_cuda (paged_kv_cuda.h): host checks (validate_paged.h, then what the kernels
// need of the device views), then up to three launches on the caller's stream: the calibration
// amax pass and its one-thread finish (opt.calibrate; stream order makes the encode pass read the
// calibrated globals), and the encode pass of append_kernels.cuh.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/paged/append_kernels.cuh"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/paged_kv_cuda.h"
#include "validate/validate_cuda.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

using paged::AppendParams;
using paged::kAppendThreads;

Status cuda_status(cudaError_t e, const char* what) {
  return sm90::cuda_status(e, "paged_kv_append_cuda", what);
}

// What the 16-byte loads need of k or v (shape and dtype are validate_paged_append's).
Status check_tokens(const TensorView& t, const char* name, const TensorView& k) {
  if (t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return Status::Unsupported(std::string(name) + ": dtype " + dtype_name(t.dtype) +
                               " is not supported by the GPU append (BF16 or FP16; the host "
                               "paged_kv_append also takes F32)");
  }
  if (t.dtype != k.dtype) {
    return Status::Invalid(std::string(name) + ": expected dtype " + dtype_name(k.dtype) +
                           " like k, got " + dtype_name(t.dtype));
  }
  FP4ATTN_RETURN_IF_ERROR(cuda_check::aligned(t.data, name, 16));
  for (int i = 0; i < 2; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % 8 != 0) {
      return Status::Invalid(std::string(name) + ": stride of dimension " + std::to_string(i) +
                             " (" + std::to_string(t.stride[i]) +
                             " elements) must be a multiple of 8 elements (16-byte loads)");
    }
  }
  return Status::Ok();
}

// The host slot values, when the caller passes a copy.
Status check_host_slots(const TensorView& host, int64_t n, const PagedKvShape& kv) {
  if (!host.defined()) return Status::Ok();
  FP4ATTN_RETURN_IF_ERROR(check_rank(host, "opt.slot_mapping_host", 1, "(num_tokens)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(host, "opt.slot_mapping_host", {DType::kI32, DType::kI64}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(host, "opt.slot_mapping_host"));
  if (host.shape[0] != n) {
    return Status::Invalid("opt.slot_mapping_host: expected shape (" + std::to_string(n) +
                           ") like slot_mapping, got " + host.shape_str());
  }
  if (n > 0) FP4ATTN_RETURN_IF_ERROR(check_not_null(host, "opt.slot_mapping_host"));
  return validate_slot_values(host, kv);
}

bool aligned_view(const TensorView& t, int bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.stride[i] % bytes != 0) return false;
  }
  return true;
}

paged::AppendSide side_of(const TensorView& x, const TensorView& data, const TensorView& scales,
                          const TensorView& global) {
  paged::AppendSide s{};
  s.x = static_cast<const uint8_t*>(x.data);
  s.x_token = x.stride[0] * 2;
  s.x_head = x.stride[1] * 2;
  s.data = static_cast<uint8_t*>(data.data);
  s.scales = static_cast<uint8_t*>(scales.data);
  for (int i = 0; i < 3; ++i) {
    s.data_s[i] = data.stride[i];
    s.scales_s[i] = scales.defined() ? scales.stride[i] : 0;
  }
  s.global = global.as<float>();
  return s;
}

template <typename T>
void launch_encode(const AppendParams& p, const PagedKvCache& c, int grid, cudaStream_t stream) {
  if (c.format == KvCacheFormat::kFp8) {
    paged::fp8_append_kernel<T><<<grid, kAppendThreads, 0, stream>>>(p);
    return;
  }
  switch (c.rule) {
    case Nvfp4ScaleRule::kNearest:
      paged::nvfp4_append_kernel<T, Nvfp4ScaleRule::kNearest>
          <<<grid, kAppendThreads, 0, stream>>>(p);
      break;
    case Nvfp4ScaleRule::kRoundUp:
      paged::nvfp4_append_kernel<T, Nvfp4ScaleRule::kRoundUp>
          <<<grid, kAppendThreads, 0, stream>>>(p);
      break;
    case Nvfp4ScaleRule::kFourOverSix:
      paged::nvfp4_append_kernel<T, Nvfp4ScaleRule::kFourOverSix>
          <<<grid, kAppendThreads, 0, stream>>>(p);
      break;
    case Nvfp4ScaleRule::kRestricted:
      paged::nvfp4_append_kernel<T, Nvfp4ScaleRule::kRestricted>
          <<<grid, kAppendThreads, 0, stream>>>(p);
      break;
  }
}

template <typename T>
void launch_calibration(const AppendParams& p, const PagedKvCache& c, int grid,
                        cudaStream_t stream) {
  paged::calibrate_amax_kernel<T><<<grid, kAppendThreads, 0, stream>>>(p);
  if (c.format == KvCacheFormat::kNvfp4) {
    paged::calibrate_finish_kernel<true><<<1, 1, 0, stream>>>(p, c.rule);
  } else {
    paged::calibrate_finish_kernel<false><<<1, 1, 0, stream>>>(p, c.rule);
  }
}

}  // namespace

Status paged_kv_append_cuda(const TensorView& k, const TensorView& v,
                            const TensorView& slot_mapping, const PagedKvCache& cache,
                            const PagedAppendCudaOptions& opt, cudaStream_t stream) {
  PagedKvShape kv;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {}, /*writable=*/true, &kv));
  int64_t n = 0;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_append(k, v, slot_mapping, kv, &n));
  FP4ATTN_RETURN_IF_ERROR(check_tokens(k, "k", k));
  FP4ATTN_RETURN_IF_ERROR(check_tokens(v, "v", k));
  FP4ATTN_RETURN_IF_ERROR(check_host_slots(opt.slot_mapping_host, n, kv));
  if (cache.format == KvCacheFormat::kNvfp4 &&
      (cache.rule < Nvfp4ScaleRule::kNearest || cache.rule > Nvfp4ScaleRule::kRestricted)) {
    return Status::Invalid("cache.rule: unknown NVFP4 scale rule");
  }
  if (n == 0) return Status::Ok();

  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  AppendParams p{};
  p.side[0] = side_of(k, cache.k_data, cache.k_scales, cache.k_global);
  p.side[1] = side_of(v, cache.v_data, cache.v_scales, cache.v_global);
  p.slots = slot_mapping.data;  // last dim contiguous (validate_paged_append)
  p.slots64 = slot_mapping.dtype == DType::kI64;
  p.error_flag = opt.error_flag;
  p.units = n * kv.kv_heads * (kv.head_dim / kNvfp4Block);
  p.div_blocks = packed::FastDiv::make(static_cast<uint64_t>(kv.head_dim / kNvfp4Block));
  p.div_heads = packed::FastDiv::make(static_cast<uint64_t>(kv.kv_heads));
  p.num_slots = static_cast<int32_t>(kv.num_pages * kv.page_size);
  p.page_size = static_cast<int32_t>(kv.page_size);
  const int store_bytes = fp4 ? 8 : 16;
  p.vec_store = aligned_view(cache.k_data, store_bytes) && aligned_view(cache.v_data, store_bytes);
  const bool f16 = k.dtype == DType::kF16;
  const int grid = packed::grid_for(p.units, kAppendThreads, 16);

  if (opt.calibrate) {
    constexpr size_t kBytes = kPagedAppendScratchBytes;
    static_assert(kBytes >= 2 * sizeof(uint32_t));
    const bool owned = opt.scratch == nullptr;
    if (!owned && reinterpret_cast<uintptr_t>(opt.scratch) % 4 != 0) {
      return Status::Invalid("opt.scratch: must be 4-byte aligned");
    }
    p.calib = static_cast<uint32_t*>(opt.scratch);
    if (owned) {
      FP4ATTN_RETURN_IF_ERROR(cuda_status(
          cudaMallocAsync(reinterpret_cast<void**>(&p.calib), kBytes, stream), "cudaMallocAsync"));
    }
    Status st = cuda_status(cudaMemsetAsync(p.calib, 0, kBytes, stream), "cudaMemsetAsync");
    if (st.ok()) {
      f16 ? launch_calibration<__half>(p, cache, grid, stream)
          : launch_calibration<__nv_bfloat16>(p, cache, grid, stream);
      st = cuda_status(cudaGetLastError(), "calibration launch");
    }
    if (st.ok()) {
      f16 ? launch_encode<__half>(p, cache, grid, stream)
          : launch_encode<__nv_bfloat16>(p, cache, grid, stream);
      st = cuda_status(cudaGetLastError(), "encode launch");
    }
    if (!owned) return st;
    const Status freed = cuda_status(cudaFreeAsync(p.calib, stream), "cudaFreeAsync");
    return st.ok() ? freed : st;
  }
  f16 ? launch_encode<__half>(p, cache, grid, stream)
      : launch_encode<__nv_bfloat16>(p, cache, grid, stream);
  return cuda_status(cudaGetLastError(), "encode launch");
}

}  // namespace fp4attn
