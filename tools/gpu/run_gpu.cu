#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/attention_cuda.h"
#include "gpu/device_util.h"
#include "gpu/run_gpu.h"
#include "validate/validate_forward.h"

namespace fp4attn::cli {

std::string gpu_unavailable_reason(Recipe recipe) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return "no CUDA device";
  const Status st = check_forward_device();
  if (!st.ok()) return st.message();
  if (!recipe_has_gpu_forward(recipe)) {
    return std::string("recipe '") + recipe_name(recipe) + "' does not run on the GPU engine yet";
  }
  return "";
}

std::string gpu_device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    return "";
  }
  return prop.name;
}

Status run_attention_gpu(const TensorView& q, const TensorView& k, const TensorView& v,
                         Recipe recipe, bool causal, double softmax_scale, const TensorView& o,
                         const TensorView& lse, double* ms) {
  const std::vector<uint16_t> hq = to_bf16(q), hk = to_bf16(k), hv = to_bf16(v);
  DeviceBuffer dq(hq.size() * 2), dk(hk.size() * 2), dv(hv.size() * 2), dout(o.numel() * 2),
      dlse(lse.numel() * 4);
  if (!dq.ptr || !dk.ptr || !dv.ptr || !dout.ptr || !dlse.ptr) {
    return Status::Invalid("backend: out of GPU memory");
  }
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "copy q"));
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(dk.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "copy k"));
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(dv.ptr, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "copy v"));
  auto view = [](void* p, DType t, const TensorView& like) {
    return make_view(p, t, {like.shape[0], like.shape[1], like.shape[2], like.shape[3]});
  };
  const TensorView tq = view(dq.ptr, DType::kBF16, q), tk = view(dk.ptr, DType::kBF16, k),
                   tv = view(dv.ptr, DType::kBF16, v), to = view(dout.ptr, DType::kBF16, o);
  const TensorView tl =
      make_view(dlse.ptr, DType::kF32, {lse.shape[0], lse.shape[1], lse.shape[2]});
  ForwardOptions opt;
  opt.recipe = recipe;
  opt.causal = causal;
  opt.softmax_scale = static_cast<float>(softmax_scale);

  // One warm-up call, then the median of five timed ones.
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  Status st;
  for (int i = 0; i < 6 && st.ok(); ++i) {
    cudaEventRecord(start);
    st = attention_forward_cuda(tq, tk, tv, opt, to, tl, nullptr);
    cudaEventRecord(stop);
    if (st.ok()) st = cuda_ok(cudaEventSynchronize(stop), "kernel");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i > 0) times.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  FP4ATTN_RETURN_IF_ERROR(st);
  std::sort(times.begin(), times.end());
  *ms = times[times.size() / 2];

  std::vector<uint16_t> ho(o.numel());
  std::vector<float> hl(lse.numel());
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(ho.data(), dout.ptr, ho.size() * 2, cudaMemcpyDeviceToHost), "copy o"));
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(hl.data(), dlse.ptr, hl.size() * 4, cudaMemcpyDeviceToHost), "copy lse"));
  for (size_t i = 0; i < ho.size(); ++i) o.as<double>()[i] = bf16_bits_to_float(ho[i]);
  for (size_t i = 0; i < hl.size(); ++i) lse.as<double>()[i] = hl[i];
  return Status::Ok();
}

}  // namespace fp4attn::cli
