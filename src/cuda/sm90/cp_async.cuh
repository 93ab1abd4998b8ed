// Per-thread asynchronous global -> shared copies (cp.async, sm_80+) and their groups.
#pragma once

#include <cstdint>

namespace fp4attn::sm90 {

// cp.async of kBytes (4, 8 or 16) to shared address dst, zero-filled (nothing read) when !valid;
// src must be a valid address anyway. 16-byte copies bypass L1 (.cg), smaller ones cannot (.ca).
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(kBytes), "r"(n)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace fp4attn::sm90
