#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/paged_attention_cuda.h"
#include "gpu/decode_gpu.h"
#include "gpu/device_util.h"

namespace fp4attn::cli {
namespace {

size_t bytes_of(const TensorView& t) {
  return t.defined() ? static_cast<size_t>(t.numel()) * dtype_size(t.dtype) : 1;
}

// A contiguous host view's bytes in a new device buffer, and the same view over it (an
// undefined view stays undefined).
struct DeviceCopy {
  DeviceBuffer buf;
  TensorView view;
  Status st;
  explicit DeviceCopy(const TensorView& host) : buf(bytes_of(host)) {
    if (!host.defined()) return;
    if (!buf.ptr) {
      st = Status::Invalid("backend: out of GPU memory");
      return;
    }
    st = cuda_ok(cudaMemcpy(buf.ptr, host.data, bytes_of(host), cudaMemcpyHostToDevice), "copy");
    view = host;
    view.data = buf.ptr;
  }
};

}  // namespace

std::string decode_gpu_unavailable_reason() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return "no CUDA device";
  // The decode kernel is built for sm_90a with the engine: the same device check.
  const Status st = check_forward_device();
  return st.ok() ? "" : st.message();
}

Status run_decode_gpu(const PagedKvCache& cache, const TensorView& q,
                      const TensorView& block_tables, const TensorView& seq_lens,
                      const PagedAttentionOptions& opt, const TensorView& o, double* ms) {
  DeviceCopy kd(cache.k_data), vd(cache.v_data), ks(cache.k_scales), vs(cache.v_scales),
      kg(cache.k_global), vg(cache.v_global), bt(block_tables), sl(seq_lens);
  for (const DeviceCopy* c : {&kd, &vd, &ks, &vs, &kg, &vg, &bt, &sl}) {
    FP4ATTN_RETURN_IF_ERROR(c->st);
  }
  PagedKvCache dc = cache;
  dc.k_data = kd.view;
  dc.v_data = vd.view;
  dc.k_scales = ks.view;
  dc.v_scales = vs.view;
  dc.k_global = kg.view;
  dc.v_global = vg.view;

  const std::vector<uint16_t> hq = to_bf16(q);
  DeviceBuffer dq(hq.size() * 2), dout(o.numel() * 2);
  if (!dq.ptr || !dout.ptr) return Status::Invalid("backend: out of GPU memory");
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "copy q"));
  const TensorView tq =
      make_view(dq.ptr, DType::kBF16, {q.shape[0], q.shape[1], q.shape[2], q.shape[3]});
  const TensorView to =
      make_view(dout.ptr, DType::kBF16, {o.shape[0], o.shape[1], o.shape[2], o.shape[3]});
  PagedAttentionCudaOptions copt;
  copt.block_tables_host = block_tables;  // the host checks of page ids and lengths
  copt.seq_lens_host = seq_lens;

  // Three warm-up calls, then the median of twenty timed ones.
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  Status st;
  for (int i = 0; i < 23 && st.ok(); ++i) {
    cudaEventRecord(start);
    st = paged_attention_cuda(tq, TensorView{}, dc, bt.view, sl.view, opt, to, TensorView{}, copt,
                              nullptr);
    cudaEventRecord(stop);
    if (st.ok()) st = cuda_ok(cudaEventSynchronize(stop), "kernel");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= 3) times.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  FP4ATTN_RETURN_IF_ERROR(st);
  std::sort(times.begin(), times.end());
  *ms = times[times.size() / 2];

  std::vector<uint16_t> ho(o.numel());
  FP4ATTN_RETURN_IF_ERROR(
      cuda_ok(cudaMemcpy(ho.data(), dout.ptr, ho.size() * 2, cudaMemcpyDeviceToHost), "copy o"));
  for (size_t i = 0; i < ho.size(); ++i) o.as<double>()[i] = bf16_bits_to_float(ho[i]);
  return Status::Ok();
}

}  // namespace fp4attn::cli
