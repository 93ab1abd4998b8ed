// Device sweeps of the fast exact helpers of the packed quantizer (src/cuda/quantize/
// packed_common.cuh) against the reference codecs, on every input where that is 2^31 / 2^32
// values: the E4M3 scale encoders of each rule (e4m3_code_nearest is the hardware
// cvt.rn.satfinite.e4m3x2.f32 on the device), the E2M1 term and magnitude, the division by 6
// of 16-bit amaxes, the PRMT sign gather and the 8-value encoder. Also requires that the raw
// hardware cvt equal float_to_e4m3 on every finite float, both lanes, and that
// e4m3_codes_nearest2 put its two distinct inputs in the right lanes, and the same of the E5M2
// hardware cvt against float_to_e5m2 (with the FP16 decode of every E5M2 code). The host side of
// the same helpers is checked by the same comparisons in hand-run sweeps; here it is the device
// arithmetic (__fsub_rn, __float2uint_ru, prmt) that is verified. Skips when no GPU is present.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "support/gpu_test_util.h"

namespace fp4attn {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int kChecks = 9;

// bad[k]: mismatch count of check k; first[k]: the first failing input bits (atomicMin).
__global__ void sweep_kernel(uint64_t begin, uint64_t end, unsigned long long* bad,
                             unsigned int* first) {
  for (uint64_t i = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t b = static_cast<uint32_t>(i);
    const float x = __uint_as_float(b);
    const uint32_t a = b & 0x7FFFFFFFu;
    bool fail[kChecks] = {};
    if (a < 0x7F800000u) {  // finite
      if ((b >> 31) == 0) {
        fail[0] = packed::e4m3_code_nearest(x) != float_to_e4m3(x);
        fail[1] = packed::e4m3_code_round_up(x) != detail::e4m3_round_up(x);
        fail[2] = packed::e4m3_code_restricted(x) != detail::e4m3_restricted_up(x);
      }
      const __nv_fp8x2_storage_t hw =
          __nv_cvt_float2_to_fp8x2(make_float2(x, x), __NV_SATFINITE, __NV_E4M3);
      fail[3] = (hw & 0xFFu) != float_to_e4m3(x) || (hw >> 8) != float_to_e4m3(x);
      if ((b >> 31) == 0) {
        // e4m3_codes_nearest2 (Four-Over-Six's c6 / c4) with distinct lanes: lo = x in bits
        // 0..7, hi = another finite non-negative float in bits 8..15 (operand order of the cvt).
        const float y = __uint_as_float((b * 0x9E3779B9u) % 0x7F800000u);
        const uint32_t c2 = packed::e4m3_codes_nearest2(x, y);
        fail[3] = fail[3] || c2 != (float_to_e4m3(x) | (uint32_t{float_to_e4m3(y)} << 8));
      }
    }
    if (a < 0x7F800000u) {  // finite: the backward's dO encoder (prep_quant.cu e5m2x2)
      const __nv_fp8x2_storage_t hw =
          __nv_cvt_float2_to_fp8x2(make_float2(x, -x), __NV_SATFINITE, __NV_E5M2);
      fail[8] = (hw & 0xFFu) != float_to_e5m2(x) || (hw >> 8) != float_to_e5m2(-x);
    }
    if (b < 256u) {  // every E5M2 code: its value is the FP16 with the code as high byte
      const float hv = __half2float(__ushort_as_half(static_cast<unsigned short>(b << 8)));
      const float want = e5m2_to_float(static_cast<uint8_t>(b));
      fail[8] = fail[8] || (want == want ? __float_as_uint(hv) != __float_as_uint(want) : hv == hv);
    }
    if (a <= 0x7F800000u) {  // not NaN
      float r;
      const uint32_t t = packed::e2m1_mag_term(x, &r);
      const uint32_t want = float_to_e2m1(x) & 0x7u;
      fail[4] = ((t >> 22) - 298u) != want || (t & 0x3FFFF0u) != 0 || (t & 0xFu) > 12 ||
                __float_as_uint(r) != __float_as_uint(e2m1_to_float(static_cast<uint8_t>(want))) ||
                packed::e2m1_mag_term(x) != t;
    }
    if (b < 0x10000u && (b & 0x7FFFu) == b) {  // every BF16 / FP16 magnitude
      const float bf = __uint_as_float(b << 16);
      const float hf = __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
      fail[5] = (a < 0x7F80u && __float_as_uint(packed::div6_16bit(bf)) !=
                                    __float_as_uint(detail::div_rn(bf, 6.f))) ||
                ((b & 0x7C00u) != 0x7C00u && __float_as_uint(packed::div6_16bit(hf)) !=
                                                 __float_as_uint(detail::div_rn(hf, 6.f)));
    }
    {
      // Sign gather and the 8-value encoder on pseudo-random BF16 words derived from b.
      uint32_t w[4];
      uint32_t h = b * 0x9E3779B9u + 0x7F4A7C15u;
      for (int k = 0; k < 4; ++k) {
        h ^= h >> 15;
        h *= 0x2C1B3C6Du;
        h ^= h >> 12;
        // keep the values finite: clear the top exponent bit of each BF16
        w[k] = h & 0xBFFFBFFFu;
      }
      uint32_t sref = 0;
      for (int k = 0; k < 4; ++k) {
        sref |= ((w[k] >> 15) & 1u) << (8 * k + 3);
        sref |= (w[k] >> 31) << (8 * k + 7);
      }
      fail[6] = (packed::sign_nibbles8(w[0], w[1], w[2], w[3]) & 0x88888888u) != sref;
      float xs[8];
      for (int k = 0; k < 4; ++k) {
        xs[2 * k] = __uint_as_float(w[k] << 16);
        xs[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      }
      const float inv = __uint_as_float(0x30000000u + (b & 0x1FFFFFFFu));  // 2^-31 .. 2^33
      uint32_t want = 0;
      for (int k = 0; k < 8; ++k) {
        want |= static_cast<uint32_t>(float_to_e2m1(detail::mul_rn(xs[k], inv))) << (4 * k);
      }
      fail[7] = packed::e2m1_encode8(xs, inv, w[0], w[1], w[2], w[3], 0x88888888u) != want;
    }
    for (int k = 0; k < kChecks; ++k) {
      if (fail[k]) {
        atomicAdd(bad + k, 1ull);
        atomicMin(first + k, b);
      }
    }
  }
}

TEST(PackedFastHelpersGpu, EveryFloatAgainstReferenceCodecs) {
  SKIP_WITHOUT_GPU();
  unsigned long long* bad = nullptr;
  unsigned int* first = nullptr;
  CUDA_OK(cudaMalloc(&bad, kChecks * sizeof(unsigned long long)));
  CUDA_OK(cudaMalloc(&first, kChecks * sizeof(unsigned int)));
  CUDA_OK(cudaMemset(bad, 0, kChecks * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(first, 0xFF, kChecks * sizeof(unsigned int)));
  sweep_kernel<<<4096, 256>>>(0, uint64_t{1} << 32, bad, first);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h_bad(kChecks);
  std::vector<unsigned int> h_first(kChecks);
  CUDA_OK(
      cudaMemcpy(h_bad.data(), bad, kChecks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  CUDA_OK(
      cudaMemcpy(h_first.data(), first, kChecks * sizeof(unsigned int), cudaMemcpyDeviceToHost));
  cudaFree(bad);
  cudaFree(first);
  const char* names[kChecks] = {"e4m3_code_nearest",
                                "e4m3_code_round_up",
                                "e4m3_code_restricted",
                                "hw cvt e4m3x2 / e4m3_codes_nearest2",
                                "e2m1_mag_term",
                                "div6_16bit",
                                "sign_nibbles8",
                                "e2m1_encode8",
                                "hw cvt e5m2x2 / E5M2 decode as FP16"};
  for (int k = 0; k < kChecks; ++k) {
    // k == 3 is required since the kernels use the hardware encoder (e4m3_code_nearest,
    // e4m3_codes_nearest2); k == 8 since the backward's prep_quant encodes dO with it.
    EXPECT_EQ(h_bad[k], 0u) << names[k] << ": first failing input bits 0x" << std::hex
                            << h_first[k];
  }
}

}  // namespace
}  // namespace fp4attn
