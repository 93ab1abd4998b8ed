// The device copy ceiling: bytes read + bytes written per second of a device-to-device copy,
// measured two ways (cudaMemcpyAsync and a plain 16-byte vectorized kernel); suites report the
// better as copy_tbps.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fp4attn::bench {

// dst and src 16-byte aligned, bytes a multiple of 16.
void launch_copy_kernel(void* dst, const void* src, size_t bytes, int sms, cudaStream_t stream);

}  // namespace fp4attn::bench
