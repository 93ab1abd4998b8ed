// A planted race for compute-sanitizer racecheck, shaped like the forward kernel's epilogue: a
// warpgroup stages a tile in shared memory, a named barrier, then one thread reads the whole tile
// (as the TMA store thread does, here with ordinary loads that racecheck can see).
//   race_probe --race    the named barrier is left out: racecheck must report a hazard
//   race_probe --fixed   with the barrier: racecheck must report none
//   race_probe --tile-max / --tile-max-arrive   the per-tile dS branch's barrier pattern (below)
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

// The per-tile dS branch's tile-max exchange (docs/kernels/bwd_sm90.md, "dS scales per tile"):
// 384 threads, warpgroup 0 idle, the two others per step: each lane stores its warp's value in
// its own slot (by step parity), a named barrier over the 256, every thread loads the 8 warps'
// slots; then, with `arrive_mix`, the bulk-dQ kernels' per-warpgroup barrier (warps 1-3
// bar.arrive, warp 0 bar.sync). There is no race, yet on the H200 racecheck reports hazards with
// arrive_mix (none without): it does not model bar.arrive beside other named barriers, which is
// why the backward's kernels only bar.sync (docs/kernels/bwd_sm90.md, "dS scales per tile").
__global__ void tile_max_exchange(float* out, bool arrive_mix) {
  __shared__ float slots[2][8][32];
  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if (wg == 0) return;
  const int cw = wg - 1;
  float acc = 0.f;
  for (int it = 0; it < 6; ++it) {
    slots[it & 1][cw * 4 + warp][lane] = float(it * 8 + cw * 4 + warp);
    asm volatile("bar.sync 5, 256;" ::: "memory");
    float m = 0.f;
    for (int w = 0; w < 8; ++w) m = fmaxf(m, slots[it & 1][w][lane]);
    acc += m;
    if (arrive_mix) {
      if (warp == 0) {
        if (cw == 0) {
          asm volatile("bar.sync 3, 128;" ::: "memory");
        } else {
          asm volatile("bar.sync 4, 128;" ::: "memory");
        }
      } else if (cw == 0) {
        asm volatile("bar.arrive 3, 128;" ::: "memory");
      } else {
        asm volatile("bar.arrive 4, 128;" ::: "memory");
      }
    }
  }
  if (threadIdx.x == 128) out[blockIdx.x] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 &&
      (std::strcmp(argv[1], "--tile-max") == 0 || std::strcmp(argv[1], "--tile-max-arrive") == 0)) {
    const bool mix = std::strcmp(argv[1], "--tile-max-arrive") == 0;
    float* out = nullptr;
    if (cudaMalloc(&out, 4 * sizeof(float)) != cudaSuccess) return 1;
    tile_max_exchange<<<4, 384>>>(out, mix);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaFree(out);
    std::printf("race_probe: tile-max exchange%s, %s\n", mix ? " with the bar.arrive mix" : "",
                cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
  }
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
