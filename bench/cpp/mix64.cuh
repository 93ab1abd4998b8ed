// SplitMix64's finalizer: element i of a seed gets its own uniform bits, so generated inputs do
// not depend on the launch shape. Shared by the benchmarks' input generators.
#pragma once

#include <cstdint>

namespace fp4attn::bench {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace fp4attn::bench
