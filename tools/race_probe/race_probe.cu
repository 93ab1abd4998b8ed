// A planted race for compute-sanitizer racecheck, shaped like the forward kernel's epilogue: a
// warpgroup stages a tile in shared memory, a named barrier, then one thread reads the whole tile
// (as the TMA store thread does, here with ordinary loads that racecheck can see).
//   race_probe --race    the named barrier is left out: racecheck must report a hazard
//   race_probe --fixed   with the barrier: racecheck must report none
// scripts/sanitize-fwd runs both and says whether racecheck caught the planted race. Note that
// racecheck does not see the async proxy (TMA, wgmma): races against those are not covered.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace {

__global__ void stage_then_read(int* out, bool barrier) {
  __shared__ int tile[128 * 8];
  const int tid = threadIdx.x;
  for (int i = 0; i < 8; ++i) tile[tid * 8 + i] = tid * 8 + i;
  if (barrier) asm volatile("bar.sync 3, 128;" ::: "memory");
  if (tid == 0) {
    int sum = 0;
    for (int i = 0; i < 128 * 8; ++i) sum += tile[i];
    out[blockIdx.x] = sum;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool race = argc > 1 && std::strcmp(argv[1], "--race") == 0;
  int* out = nullptr;
  if (cudaMalloc(&out, 4 * sizeof(int)) != cudaSuccess) return 1;
  stage_then_read<<<4, 128>>>(out, !race);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(out);
  std::printf("race_probe: %s, %s\n", race ? "barrier left out" : "with barrier",
              cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
