#include <cuda_bf16.h>

#include <cmath>

#include "fwd_device.h"
#include "mix64.cuh"
#include "timing.h"

namespace fp4attn::bench {
namespace {

// One pair of normals per 64 random bits: two 32-bit uniforms in (0, 1], then Box-Muller.
__global__ void normal_kernel(__nv_bfloat16* dst, size_t count, uint64_t seed) {
  const size_t pairs = (count + 1) / 2;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < pairs; i += stride) {
    const uint64_t r = mix64(seed * 0xD1B54A32D192ED03ull + i);
    const float u1 = (static_cast<float>(r & 0xFFFFFFFFu) + 1.f) * 0x1p-32f;  // never 0: log
    const float u2 = static_cast<float>(r >> 32) * 0x1p-32f;
    const float radius = sqrtf(-2.f * logf(u1));
    float sn, cs;
    sincospif(2.f * u2, &sn, &cs);
    dst[2 * i] = __float2bfloat16(radius * cs);
    if (2 * i + 1 < count) dst[2 * i + 1] = __float2bfloat16(radius * sn);
  }
}

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void fill_normal_bf16(void* dst, size_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  normal_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), count, seed);
  BENCH_CUDA(cudaGetLastError());
}

std::vector<uint16_t> copy_slice_bf16(const void* x, int64_t s, int64_t h, int64_t d, int64_t batch,
                                      int64_t head, cudaStream_t stream) {
  std::vector<uint16_t> out(static_cast<size_t>(s * d));
  if (out.empty()) return out;
  const size_t row = static_cast<size_t>(d) * 2, pitch = static_cast<size_t>(h * d) * 2;
  const auto* src = static_cast<const uint8_t*>(x) + (batch * s * h + head) * d * 2;
  BENCH_CUDA(cudaMemcpy2DAsync(out.data(), row, src, pitch, row, static_cast<size_t>(s),
                               cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return out;
}

double measure_sm_clock_mhz(cudaStream_t stream) {
  constexpr long long kCycles = 20'000'000;  // ~10 ms at 2 GHz: event resolution is ~1 us
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaEventRecord(a, stream));
  spin_kernel<<<1, 1, 0, stream>>>(kCycles);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaEventRecord(b, stream));
  BENCH_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms > 0 ? static_cast<double>(kCycles) / (static_cast<double>(ms) * 1e3) : std::nan("");
}

}  // namespace fp4attn::bench
