// Shared by the GPU tests: skip cleanly on machines without a CUDA device (CI compiles and lists
// the tests there).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace fp4attn::testing {

inline bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

constexpr size_t kGuard = 64;
constexpr uint8_t kPoison = 0xAB;

// A device buffer of n bytes followed by kGuard guard bytes, all poisoned with kPoison (or the
// given contents, guards still poisoned): outputs not written stay 0xAB, writes past the end
// show up in the guards.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t n) : n_(n) {
    ok_ = cudaMalloc(&ptr_, n + kGuard) == cudaSuccess &&
          cudaMemset(ptr_, kPoison, n + kGuard) == cudaSuccess;
  }
  template <typename T>
  explicit GuardedBuffer(const std::vector<T>& v) : GuardedBuffer(v.size() * sizeof(T)) {
    ok_ =
        ok_ && (v.empty() || cudaMemcpy(ptr_, v.data(), n_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~GuardedBuffer() { cudaFree(ptr_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  bool ok() const { return ok_; }
  // Payload and guards; empty if the copy failed.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> v(n_ + kGuard);
    if (cudaMemcpy(v.data(), ptr_, v.size(), cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
    return v;
  }
  // The n payload bytes; records a failure if the copy failed or a guard byte changed.
  std::vector<uint8_t> payload(const char* what) const {
    std::vector<uint8_t> v = bytes();
    EXPECT_EQ(v.size(), n_ + kGuard) << what << ": copy back failed";
    if (v.size() != n_ + kGuard) return {};
    for (size_t i = n_; i < v.size(); ++i) {
      if (v[i] != kPoison) {
        ADD_FAILURE() << what << ": guard byte " << i - n_ << " after the output was written";
        break;
      }
    }
    v.resize(n_);
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
  bool ok_ = false;
};

// A seed from the OS for tests that draw fresh inputs each run (print it: SCOPED_TRACE).
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// A typed device array of n elements; ptr is null when the allocation failed.
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    if (cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void poison(uint8_t byte) { ASSERT_EQ(cudaMemset(ptr, byte, n * sizeof(T)), cudaSuccess); }
};

}  // namespace fp4attn::testing

#define SKIP_WITHOUT_GPU() \
  if (!::fp4attn::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"
