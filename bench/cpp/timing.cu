#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "mix64.cuh"
#include "timing.h"

namespace fp4attn::bench {

void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "fp4attn_bench: %s failed at %s:%d: %s\n", what, file, line,
               cudaGetErrorString(e));
  std::exit(2);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) BENCH_CUDA(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

namespace {

// Sum of four uniforms, centred and scaled to unit variance (Irwin-Hall): close enough to N(0, 1)
// for timing, and cheap.
__global__ void fill_kernel(__nv_bfloat16* dst, size_t count, uint64_t seed) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    const uint64_t r = mix64(seed * 0x100000001B3ull + i);
    float sum = 0.f;
    for (int k = 0; k < 4; ++k)
      sum += static_cast<float>((r >> (16 * k)) & 0xFFFF) * (1.f / 65536.f);
    dst[i] = __float2bfloat16((sum - 2.f) * 1.7320508f);
  }
}

}  // namespace

void fill_random_bf16(void* dst, size_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), count, seed);
  BENCH_CUDA(cudaGetLastError());
}

Timing time_launches(const std::function<void(int slot)>& launch, int slots,
                     const TimingConfig& config, cudaStream_t stream) {
  slots = std::max(slots, 1);
  const int total = config.warmup + config.reps;
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(total));
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int s = 0; s < total; ++s) {
    BENCH_CUDA(cudaEventRecord(events[2 * s], stream));
    for (int slot = 0; slot < slots; ++slot) launch(slot);
    BENCH_CUDA(cudaEventRecord(events[2 * s + 1], stream));
  }
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int s = config.warmup; s < total; ++s) {
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, events[2 * s], events[2 * s + 1]));
    ms.push_back(static_cast<double>(t) / slots);
  }
  for (auto& e : events) cudaEventDestroy(e);
  Timing r;
  r.samples = static_cast<int>(ms.size());
  r.launches_per_sample = slots;
  if (ms.empty()) return r;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  r.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  return r;
}

int rotation_slots(size_t bytes_per_launch, size_t l2_bytes, int max_slots) {
  if (bytes_per_launch == 0) return 1;
  const size_t target = 4 * l2_bytes;
  const size_t n = (target + bytes_per_launch - 1) / bytes_per_launch;
  return static_cast<int>(std::clamp<size_t>(n, 1, static_cast<size_t>(max_slots)));
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.sms = p.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  d.global_mem = p.totalGlobalMem;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  return d;
}

Clocks read_clocks(int device) {
  Clocks c;
  char cmd[256];
  std::snprintf(cmd, sizeof cmd,
                "nvidia-smi -i %d --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu "
                "--format=csv,noheader,nounits 2>/dev/null",
                device);
  FILE* f = popen(cmd, "r");
  if (!f) return c;
  char line[256] = {0};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  pclose(f);
  if (!got) return c;
  // Four comma-separated fields; one that reads "[N/A]" stays NaN.
  double* fields[4] = {&c.sm_mhz, &c.max_sm_mhz, &c.power_w, &c.temp_c};
  char* p = line;
  for (double* field : fields) {
    char* end = nullptr;
    const double v = std::strtod(p, &end);
    *field = end != p ? v : std::nan("");
    char* comma = std::strchr(p, ',');
    if (!comma) break;
    p = comma + 1;
  }
  c.ok = !std::isnan(c.sm_mhz);
  return c;
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fp4attn::bench
