// Device helpers of the decode suite: the read-only bandwidth ceiling.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fp4attn::bench {

// Reads `bytes` (a multiple of 16, 16-byte aligned) once with 16-byte loads on 8 CTAs of 256
// threads per SM; writes nothing (sink is touched only for a fold value that does not occur).
void launch_read_kernel(const void* src, size_t bytes, uint32_t* sink, int sms,
                        cudaStream_t stream);

}  // namespace fp4attn::bench
