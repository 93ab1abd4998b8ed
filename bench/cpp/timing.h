// The benchmark timing kit: CUDA-event timing with warm-up and medians, input rotation for
// working sets that would fit in L2, device facts and SM clock readings. Used by every suite of
// fp4attn_bench (docs/benchmarks.md says how the numbers are used).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fp4attn::bench {

// Benchmarks have no recovery path: a failed CUDA call prints where and exits.
void cuda_check(cudaError_t e, const char* what, const char* file, int line);
#define BENCH_CUDA(expr) ::fp4attn::bench::cuda_check((expr), #expr, __FILE__, __LINE__)

// One device allocation, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Fills `count` BF16 values with seeded pseudo-random values, roughly N(0, 1) (never zeros:
// zeros can run faster than real data).
void fill_random_bf16(void* dst, size_t count, uint64_t seed, cudaStream_t stream);

struct TimingConfig {
  int warmup = 3;  // samples run and discarded first
  int reps = 20;   // samples timed
};

struct Timing {
  double median_ms = 0;  // per launch
  double min_ms = 0;
  double max_ms = 0;
  int samples = 0;
  int launches_per_sample = 0;
};

// Times launch(slot). A sample is one pass over slot = 0 .. slots - 1 between two CUDA events
// (so with rotation every launch reads a different buffer); its time divided by `slots` is one
// per-launch time. `warmup` samples are run first and dropped; the median of `reps` samples is
// reported.
Timing time_launches(const std::function<void(int slot)>& launch, int slots,
                     const TimingConfig& config, cudaStream_t stream);

// How many input sets to rotate so that one pass over them touches at least 4x the L2 (60 MB
// on H200): reads then come from HBM, not L2. 1 when one set is already that large.
int rotation_slots(size_t bytes_per_launch, size_t l2_bytes, int max_slots = 64);

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sms = 0;
  size_t l2_bytes = 0;
  size_t global_mem = 0;
  int cc_major = 0, cc_minor = 0;
};
DeviceInfo device_info(int device);

// SM clock, its maximum, power and temperature read from nvidia-smi (ok false when it is not
// there). Read before and after a suite to see whether the clocks held.
struct Clocks {
  bool ok = false;
  double sm_mhz = 0, max_sm_mhz = 0, power_w = 0, temp_c = 0;
};
Clocks read_clocks(int device);

// "2026-11-29T17:05:00Z"
std::string utc_now_iso();

}  // namespace fp4attn::bench
