// Internal launchers shared by the packed-storage sources (not part of the public API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::packed {

// Queues max over x of the FP32 bits of |x| (NaN-propagating, see tensor_amax_cuda) into
// *bits_device (as an unsigned atomicMax; the caller zeroes it first). x is validated and
// non-empty.
void launch_amax_bits(const TensorView& x, uint32_t* bits_device, cudaStream_t stream);

}  // namespace fp4attn::packed

namespace fp4attn {
struct PackedTensor;
}

namespace fp4attn::packed {

// Checks of a PackedTensor input (dequantizer and repack); returns its b, s, h and head_dim.
Status check_packed(const PackedTensor& in, int64_t* b, int64_t* s, int64_t* h, int64_t* d);

}  // namespace fp4attn::packed
