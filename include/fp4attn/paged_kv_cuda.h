// GPU append of the paged KV cache (issue 9): the bytes of the host paged_kv_append (paged_kv.h),
// written by CUDA kernels queued on `stream` (nothing synchronizes). docs/kernels/decode.md,
// "GPU append", has the prose version.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fp4attn/paged_kv.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn {

struct PagedAppendCudaOptions {
  // Host copy of slot_mapping's values (I32 or I64 [num_tokens] like slot_mapping, host memory),
  // optional. When defined, the host append's value checks run on it before any launch: a slot out
  // of range or written twice is an error and nothing is queued. Without it the values are not
  // checked on the host (that would need a device-to-host copy and a sync), but the kernels still
  // never write outside the cache: a negative slot is skipped (padding), a slot >= num_pages *
  // page_size is skipped and reported in error_flag, and a slot written twice ends up holding one
  // of its tokens.
  TensorView slot_mapping_host;
  // Device I32 [1], optional: the kernels OR kPagedErrorSlotPastCache (paged_kv.h) into it.
  int32_t* error_flag = nullptr;
  // true: a global that is 0 in device memory is calibrated from this append, as the host append
  // does (an amax pass over the written tokens and a one-thread finish before the encode kernel;
  // the amax pass exits at once when both globals are already set); it stays 0 while the written
  // tokens' finite amax is 0. false: the globals are used as stored, one launch per append; the
  // caller guarantees they are finite and > 0.
  bool calibrate = true;
  // Device scratch of the calibration (kPagedAppendScratchBytes, 4-byte aligned), optional:
  // without it a calibrating call allocates and frees it on the stream (cudaMallocAsync).
  void* scratch = nullptr;
};

// Bytes of PagedAppendCudaOptions::scratch.
inline constexpr size_t kPagedAppendScratchBytes = 16;

// Writes new tokens into their slots on the GPU, byte for byte what paged_kv_append writes.
//   k, v: [num_tokens, kv_heads, head_dim] BF16 or FP16 (the same dtype), device memory, data
//     16-byte aligned, token and head strides multiples of 8 elements, last dim contiguous (the
//     kernels read 16-byte vectors). F32 tokens (accepted by the host append) are Unsupported.
//   slot_mapping: I32 or I64 [num_tokens], device memory, slot = page * page_size + offset, < 0
//     skips (read at full width: an I64 slot is never narrowed).
//   cache: as paged_kv.h (NVFP4 with any rule, or FP8), every view in device memory, any strides
//     (16/8-byte stores where the views' addresses allow, byte stores otherwise). k_global and
//     v_global are read (and, when 0 and opt.calibrate, written) on the device; a nonzero stored
//     value must be finite and > 0 (it cannot be checked without a sync).
// Bad shapes, dtypes, alignment or host slot values: a Status naming the argument, nothing
// launched. An empty append (num_tokens 0) launches nothing and returns Ok.
Status paged_kv_append_cuda(const TensorView& k, const TensorView& v,
                            const TensorView& slot_mapping, const PagedKvCache& cache,
                            const PagedAppendCudaOptions& opt, cudaStream_t stream);

}  // namespace fp4attn
