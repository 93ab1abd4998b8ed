// A planted race for compute-sanitizer racecheck, shaped like the forward kernel's epilogue: a
// warpgroup stages a tile in shared memory, a named barrier, then one thread reads the whole tile
// (as the TMA store thread does, here with ordinary loads that racecheck can see).
//   fp4attn_race_probe --race    the named barrier is left out: racecheck must report a hazard
//   fp4attn_race_probe --fixed   with the barrier (also the default): racecheck must report none
//   fp4attn_race_probe --tile-max / --tile-max-arrive   the per-tile dS branch's barrier pattern
// bench/scripts/sanitize-fwd runs the first two and says whether racecheck caught the planted race.
// Note that racecheck does not see the async proxy (TMA, wgmma): races against those are not
// covered.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli_args.h"

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

int run_tile_max(bool mix) {
  float* out = nullptr;
  if (cudaMalloc(&out, 4 * sizeof(float)) != cudaSuccess) return 1;
  tile_max_exchange<<<4, 384>>>(out, mix);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(out);
  std::printf("race_probe: tile-max exchange%s, %s\n", mix ? " with the bar.arrive mix" : "",
              cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}

int run_stage(bool race) {
  int* out = nullptr;
  if (cudaMalloc(&out, 4 * sizeof(int)) != cudaSuccess) return 1;
  stage_then_read<<<4, 128>>>(out, !race);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(out);
  std::printf("race_probe: %s, %s\n", race ? "barrier left out" : "with barrier",
              cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fp4attn::cli;
  const std::vector<FlagSpec> flags = {
      {"race", false, "leave the named barrier out (racecheck must report a hazard)", ""},
      {"fixed", false, "keep the barrier (the default; racecheck must report none)", ""},
      {"tile-max", false, "the per-tile dS branch's tile-max exchange", ""},
      {"tile-max-arrive", false, "the same with the bulk-dQ kernels' bar.arrive mix", ""},
      {"help", false, "show this help", ""},
  };
  try {
    const Args a(std::vector<std::string>(argv + 1, argv + argc), flags);
    if (a.has("help")) {
      std::printf("%s", format_help("usage: fp4attn_race_probe [--race | --fixed | --tile-max | "
                                    "--tile-max-arrive]\n\nA planted race for racecheck.",
                                    flags)
                            .c_str());
      return 0;
    }
    if (a.has("tile-max") || a.has("tile-max-arrive"))
      return run_tile_max(a.has("tile-max-arrive"));
    return run_stage(a.has("race"));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fp4attn_race_probe: %s\n", e.what());
    return 2;
  }
}
