#include <cstdint>

#include "decode_device.h"
#include "timing.h"

namespace fp4attn::bench {
namespace {

// Grid-stride 16-byte loads, four in flight per thread, folded by XOR; the fold is stored only if
// it equals a value it practically never takes, so the loads cannot be removed and nothing is
// written.
__global__ void __launch_bounds__(256)
    read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* sink) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) acc ^= src[i].x ^ src[i].y ^ src[i].z ^ src[i].w;
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

}  // namespace

void launch_read_kernel(const void* src, size_t bytes, uint32_t* sink, int sms,
                        cudaStream_t stream) {
  const size_t n = bytes / 16;
  size_t blocks = static_cast<size_t>(sms) * 8;
  const size_t needed = (n + 255) / 256;
  if (needed < blocks) blocks = needed > 0 ? needed : 1;
  read_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<const uint4*>(src), n,
                                                                 sink);
  BENCH_CUDA(cudaGetLastError());
}

}  // namespace fp4attn::bench
