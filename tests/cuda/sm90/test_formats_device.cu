// Every codec and block quantizer of formats.h / quantize.h run on the device and compared with
// the host functions bit for bit: all codes, a sweep of floats around every rounding boundary,
// and random plus special blocks for each scale rule. Skips when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/scale_layout.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A device buffer holding a copy of a host vector, copied back with to_host().
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { ok_ = cudaMalloc(&ptr_, n * sizeof(T)) == cudaSuccess; }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    ok_ = ok_ && cudaMemcpy(ptr_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  bool ok() const { return ok_; }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    if (cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
      v.clear();
    }
    return v;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
  bool ok_ = false;
};

// ---- element codecs ---------------------------------------------------------------------------

// Decodes of every code: out[c * 4 + k] for k = e2m1, e4m3, e5m2, ue8m0.
__global__ void decode_all_codes(float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= 256) return;
  out[c * 4 + 0] = e2m1_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 1] = e4m3_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 2] = e5m2_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 3] = ue8m0_to_float(static_cast<uint8_t>(c));
}

constexpr int kEncodings = 6;  // e2m1, e4m3, e5m2, ue8m0 floor, ue8m0 ceil, floor_log2 (low 8)

__host__ __device__ void encode_all(float x, uint8_t* out) {
  out[0] = float_to_e2m1(x);
  out[1] = float_to_e4m3(x);
  out[2] = float_to_e5m2(x);
  out[3] = float_to_ue8m0(x, Ue8m0Round::kFloor);
  out[4] = float_to_ue8m0(x, Ue8m0Round::kCeil);
  const bool finite_nonzero = x == x && x != 0.f && fabsf(x) <= FLT_MAX;
  out[5] = finite_nonzero ? static_cast<uint8_t>(floor_log2(x)) : 0;
}

__global__ void encode_floats(const uint32_t* in, int64_t n, uint8_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    encode_all(__uint_as_float(in[i]), out + i * kEncodings);
  }
}

TEST(FormatsDevice, DecodeEveryCodeLikeTheHost) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<float> d_out(256 * 4);
  ASSERT_TRUE(d_out.ok());
  decode_all_codes<<<1, 256>>>(d_out.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = d_out.to_host();
  ASSERT_EQ(got.size(), 256u * 4);
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    EXPECT_EQ(bits_of(got[c * 4 + 0]), bits_of(e2m1_to_float(b))) << c;
    EXPECT_EQ(bits_of(got[c * 4 + 1]), bits_of(e4m3_to_float(b))) << c;
    EXPECT_EQ(bits_of(got[c * 4 + 2]), bits_of(e5m2_to_float(b))) << c;
    EXPECT_EQ(bits_of(got[c * 4 + 3]), bits_of(ue8m0_to_float(b))) << c;
  }
}

// Every float whose top 20 bits (sign, exponent, 11 mantissa bits) take any value, with the low 12
// mantissa bits set to patterns that sit on, just above and just below rounding boundaries.
std::vector<uint32_t> float_sweep() {
  const uint32_t lows[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF, 0x5A3};
  std::vector<uint32_t> v;
  v.reserve((size_t{1} << 20) * 7);
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    for (uint32_t lo : lows) v.push_back((hi << 12) | lo);
  }
  return v;
}

TEST(FormatsDevice, EncodeFloatSweepLikeTheHost) {
  SKIP_WITHOUT_GPU();
  const std::vector<uint32_t> in = float_sweep();
  const int64_t n = static_cast<int64_t>(in.size());
  DeviceBuffer<uint32_t> d_in(in);
  DeviceBuffer<uint8_t> d_out(in.size() * kEncodings);
  ASSERT_TRUE(d_in.ok() && d_out.ok());
  encode_floats<<<1024, 256>>>(d_in.get(), n, d_out.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = d_out.to_host();
  ASSERT_EQ(got.size(), in.size() * kEncodings);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint8_t want[kEncodings];
    encode_all(float_of(in[i]), want);
    for (int k = 0; k < kEncodings; ++k) {
      if (got[i * kEncodings + k] != want[k] && ++mismatches <= 10) {
        ADD_FAILURE() << "encoding " << k << " of 0x" << std::hex << in[i] << ": device 0x"
                      << int{got[i * kEncodings + k]} << ", host 0x" << int{want[k]};
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- block quantizers -------------------------------------------------------------------------

// One block job: x[offset .. offset + n * stride), results at job index.
struct BlockJob {
  int64_t offset;
  int n;
  int64_t stride;
  float s_enc;
};

constexpr int kNvRules = 4, kMxRules = 2, kFp8Formats = 2;
constexpr int kCodesPerJob = kNvRules * kNvfp4Block + kMxRules * kMxfp4Block + kFp8Formats * 32;
constexpr int kScalesPerJob = kNvRules + kMxRules;

// All quantizers on one job: NVFP4 for each rule (first 16 values), MXFP4 for each rule (first
// 32), FP8 for each format (strided), plus the dequantized values of every NVFP4/MXFP4 code.
__host__ __device__ void run_job(const float* x, const BlockJob& job, uint8_t* codes,
                                 uint8_t* scales, float* fp8_scales, float* deq) {
  const int n_nv = job.n < kNvfp4Block ? job.n : kNvfp4Block;
  const int n_fp8 = job.n < 32 ? job.n : 32;
  for (int r = 0; r < kNvRules; ++r) {
    uint8_t* c = codes + r * kNvfp4Block;
    scales[r] = nvfp4_quantize_block(x, n_nv, job.s_enc, static_cast<Nvfp4ScaleRule>(r), c);
    for (int i = 0; i < n_nv; ++i)
      deq[r * kNvfp4Block + i] = nvfp4_dequantize(c[i], scales[r], job.s_enc);
  }
  for (int r = 0; r < kMxRules; ++r) {
    uint8_t* c = codes + kNvRules * kNvfp4Block + r * kMxfp4Block;
    const int s = kNvRules + r;
    scales[s] = mxfp4_quantize_block(x, job.n, static_cast<MxScaleRule>(r), c);
    for (int i = 0; i < job.n; ++i) {
      deq[kNvRules * kNvfp4Block + r * kMxfp4Block + i] = mxfp4_dequantize(c[i], scales[s]);
    }
  }
  for (int f = 0; f < kFp8Formats; ++f) {
    uint8_t* c = codes + kNvRules * kNvfp4Block + kMxRules * kMxfp4Block + f * 32;
    fp8_scales[f] = fp8_quantize_block(x, n_fp8, job.stride, static_cast<Fp8Format>(f), c);
  }
}

constexpr int kDeqPerJob = kNvRules * kNvfp4Block + kMxRules * kMxfp4Block;

__global__ void run_jobs(const float* x, const BlockJob* jobs, int n_jobs, uint8_t* codes,
                         uint8_t* scales, float* fp8_scales, float* deq) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n_jobs) return;
  const BlockJob job = jobs[j];
  run_job(x + job.offset, job, codes + int64_t{j} * kCodesPerJob, scales + j * kScalesPerJob,
          fp8_scales + j * kFp8Formats, deq + int64_t{j} * kDeqPerJob);
}

// Random blocks over many magnitudes plus special ones: zeros, NaN, Inf, tails, subnormals,
// huge values, and s_enc values from tensor scales.
void make_jobs(std::vector<float>* x, std::vector<BlockJob>* jobs) {
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> g;
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (int j = 0; j < 20000; ++j) {
    BlockJob job;
    job.n = 1 + static_cast<int>(rng() % 32);
    job.stride = 1 + static_cast<int64_t>(rng() % 3);
    job.offset = static_cast<int64_t>(x->size());
    const int64_t len = job.n * job.stride;
    const int shift = static_cast<int>(rng() % 280) - 150;
    for (int64_t i = 0; i < len; ++i) x->push_back(std::ldexp(g(rng), shift));
    float* b = x->data() + job.offset;
    switch (j % 10) {
      case 0:
        for (int64_t i = 0; i < len; ++i) b[i] = (i % 2) ? -0.f : 0.f;
        break;
      case 1:
        b[rng() % len] = (rng() & 1) ? kNan : -kInf;
        break;
      case 2:
        b[rng() % len] = FLT_MAX;
        break;
      case 3:
        b[0] = float_of(static_cast<uint32_t>(rng() % 0x00800000u));  // subnormal
        break;
      default:
        break;
    }
    float amax = 0.f;
    for (int64_t i = 0; i < len; ++i) amax = fmaxf(amax, fabsf(b[i]));
    const Nvfp4ScaleRule r = static_cast<Nvfp4ScaleRule>(rng() % 4);
    job.s_enc = (j % 3 == 0) ? 1.f : nvfp4_tensor_scale(amax * (1.f + rng() % 8), r);
    jobs->push_back(job);
  }
}

// Bitwise equality, except that any two NaNs match: a product with a NaN operand keeps the
// operand's payload on x86 and gives the canonical NaN on the GPU.
bool same_bits(uint8_t a, uint8_t b) { return a == b; }
bool same_bits(float a, float b) { return (a != a && b != b) || bits_of(a) == bits_of(b); }

// Appends " name[i] host/device" for the first index where host and device differ.
template <typename T>
void describe_diff(const char* name, const T* host, const T* device, int n, std::string* out) {
  for (int i = 0; i < n; ++i) {
    if (!same_bits(host[i], device[i])) {
      std::ostringstream s;
      s << " " << name << "[" << i << "] " << +host[i] << "/" << +device[i];
      *out += s.str();
      return;
    }
  }
}

TEST(FormatsDevice, BlockQuantizersLikeTheHost) {
  SKIP_WITHOUT_GPU();
  std::vector<float> x;
  std::vector<BlockJob> jobs;
  make_jobs(&x, &jobs);
  const int n_jobs = static_cast<int>(jobs.size());
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<BlockJob> d_jobs(jobs);
  DeviceBuffer<uint8_t> d_codes(size_t{kCodesPerJob} * n_jobs);
  DeviceBuffer<uint8_t> d_scales(size_t{kScalesPerJob} * n_jobs);
  DeviceBuffer<float> d_fp8_scales(size_t{kFp8Formats} * n_jobs);
  DeviceBuffer<float> d_deq(size_t{kDeqPerJob} * n_jobs);
  ASSERT_TRUE(d_x.ok() && d_jobs.ok() && d_codes.ok() && d_scales.ok() && d_fp8_scales.ok() &&
              d_deq.ok());
  CUDA_OK(cudaMemset(d_codes.get(), 0, size_t{kCodesPerJob} * n_jobs));
  CUDA_OK(cudaMemset(d_deq.get(), 0, size_t{kDeqPerJob} * n_jobs * sizeof(float)));
  run_jobs<<<(n_jobs + 127) / 128, 128>>>(d_x.get(), d_jobs.get(), n_jobs, d_codes.get(),
                                          d_scales.get(), d_fp8_scales.get(), d_deq.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> codes = d_codes.to_host(), scales = d_scales.to_host();
  const std::vector<float> fp8_scales = d_fp8_scales.to_host(), deq = d_deq.to_host();
  ASSERT_FALSE(codes.empty() || scales.empty() || fp8_scales.empty() || deq.empty());
  int failures = 0;
  for (int j = 0; j < n_jobs && failures < 10; ++j) {
    std::vector<uint8_t> want_codes(kCodesPerJob, 0), want_scales(kScalesPerJob);
    std::vector<float> want_fp8(kFp8Formats), want_deq(kDeqPerJob, 0.f);
    run_job(x.data() + jobs[j].offset, jobs[j], want_codes.data(), want_scales.data(),
            want_fp8.data(), want_deq.data());
    std::string diff;
    describe_diff("codes", want_codes.data(), &codes[size_t{kCodesPerJob} * j], kCodesPerJob,
                  &diff);
    describe_diff("scales", want_scales.data(), &scales[size_t{kScalesPerJob} * j], kScalesPerJob,
                  &diff);
    describe_diff("fp8 scales", want_fp8.data(), &fp8_scales[size_t{kFp8Formats} * j], kFp8Formats,
                  &diff);
    describe_diff("dequantized", want_deq.data(), &deq[size_t{kDeqPerJob} * j], kDeqPerJob, &diff);
    if (!diff.empty()) {
      ++failures;
      ADD_FAILURE() << "job " << j << " (n " << jobs[j].n << ", stride " << jobs[j].stride
                    << ", s_enc " << jobs[j].s_enc << "): host != device at" << diff;
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- swizzled scale offsets -------------------------------------------------------------------

__global__ void swizzle_offsets(int64_t rows, int64_t cols, int64_t* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < rows * cols) out[i] = swizzled_scale_offset(i / cols, i % cols, cols);
}

TEST(FormatsDevice, SwizzledOffsetsLikeTheHost) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 300, cols = 7;
  DeviceBuffer<int64_t> d_out(rows * cols);
  ASSERT_TRUE(d_out.ok());
  swizzle_offsets<<<(rows * cols + 255) / 256, 256>>>(rows, cols, d_out.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int64_t> got = d_out.to_host();
  ASSERT_EQ(got.size(), static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(got[i], swizzled_scale_offset(i / cols, i % cols, cols)) << i;
  }
}

}  // namespace
}  // namespace fp4attn
