// Device helpers of the fwd suite: seeded N(0, 1) BF16 inputs, copies of one (batch, head) slice
// of a BSHD tensor to the host, and a direct SM clock reading.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fp4attn::bench {

// count BF16 values, N(0, 1) by Box-Muller (the accuracy figures are quoted for Gaussian inputs,
// so unlike fill_random_bf16 the tails are Gaussian too). Deterministic for a seed.
void fill_normal_bf16(void* dst, size_t count, uint64_t seed, cudaStream_t stream);

// Rows [0, s) of x[batch, :, head, :] of a contiguous BSHD BF16 tensor [b, s, h, d] as raw BF16
// bits, [s][d]. Synchronous.
std::vector<uint16_t> copy_slice_bf16(const void* x, int64_t s, int64_t h, int64_t d, int64_t batch,
                                      int64_t head, cudaStream_t stream);

// The SM clock in MHz measured on the device: a kernel spins for a fixed number of clock64()
// cycles between two CUDA events. Read right after a timed loop it gives the clock the loop ran
// at (nvidia-smi, a separate process, reads it later and often idle).
double measure_sm_clock_mhz(cudaStream_t stream);

}  // namespace fp4attn::bench
