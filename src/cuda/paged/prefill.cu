// paged_prefill_cuda and paged_prefill_repack_cuda (paged_prefill_cuda.h): every check first (the
// paged validation, the host index copies, the views of every launch), then the repack kernel
// (prefill_repack.cu), Q's operand quantizer and the forward engine, in that order on the
// caller's stream. Nothing synchronizes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/paged/cache_side.h"
#include "cuda/paged/prefill_repack.h"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/attention_cuda.h"
#include "fp4attn/operands_cuda.h"
#include "fp4attn/paged_prefill_cuda.h"
#include "validate/paged_launch_checks.h"
#include "validate/validate_attention.h"
#include "validate/validate_forward.h"
#include "validate/validate_operands.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

constexpr int64_t kWorkspaceAlign = 256;

Status cuda_status(cudaError_t e, const char* what) {
  return sm90::cuda_status(e, "paged_prefill_cuda", what);
}

Status check_host_copy(const TensorView& host, const TensorView& dev, const char* name) {
  if (!host.defined()) {
    return Status::Invalid(std::string(name) +
                           ": required (host copy of the device tensor: the launches need the "
                           "lengths on the host)");
  }
  return paged::check_host_copy_like(host, dev, name);
}

// Checks of the repack's arguments (cache views, block tables and their host copy against the
// layout); fills kv.
Status check_repack(const PagedKvCache& cache, const TensorView& block_tables,
                    const TensorView& block_tables_host, const PagedPrefillLayout& x,
                    PagedKvShape* kv) {
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {64, 128}, /*writable=*/false, kv));
  FP4ATTN_RETURN_IF_ERROR(check_rank(block_tables, "block_tables", 2, "(batch, max_pages)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(block_tables, "block_tables", {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(block_tables, "block_tables"));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(block_tables, "block_tables"));
  FP4ATTN_RETURN_IF_ERROR(
      check_host_copy(block_tables_host, block_tables, "copt.block_tables_host"));
  if (block_tables.shape[0] != x.b || kv->kv_heads != x.kv_heads || kv->head_dim != x.head_dim) {
    return Status::Invalid("layout: batch " + std::to_string(x.b) + ", kv heads " +
                           std::to_string(x.kv_heads) + " or head_dim " +
                           std::to_string(x.head_dim) +
                           " differ from block_tables' batch and the cache's kv heads/head_dim");
  }
  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  FP4ATTN_RETURN_IF_ERROR(
      paged::check_vector_view(cache.k_data, "k_cache", fp4 ? 8 : 16, "repack"));
  FP4ATTN_RETURN_IF_ERROR(
      paged::check_vector_view(cache.v_data, "v_cache", fp4 ? 8 : 16, "repack"));
  // The lengths and page ids the kernel will use (host copy).
  const int64_t max_pages = block_tables.shape[1];
  const int32_t* bt = block_tables_host.as<const int32_t>();
  for (int64_t i = 0; i < x.b; ++i) {
    if (x.len(i) > max_pages * kv->page_size) {
      return Status::Invalid(
          "seq_lens[" + std::to_string(i) + "]: " + std::to_string(x.len(i)) +
          " exceeds max_pages * page_size = " + std::to_string(max_pages * kv->page_size));
    }
    for (int64_t p = 0; p < (x.len(i) + kv->page_size - 1) / kv->page_size; ++p) {
      const int64_t id = bt[i * block_tables_host.stride[0] + p * block_tables_host.stride[1]];
      if (id < 0 || id >= kv->num_pages) {
        return Status::Invalid("block_tables[" + std::to_string(i) + ", " + std::to_string(p) +
                               "]: page id " + std::to_string(id) + " is out of range [0, " +
                               std::to_string(kv->num_pages) + ")");
      }
    }
  }
  return Status::Ok();
}

// The launches of the repack, checked: sequences in chunks of kRepackMaxSeqs, 32-bit prefix sums
// inside a chunk.
Status plan_repack(const PagedKvCache& cache, const TensorView& block_tables,
                   const PagedPrefillLayout& x, const PagedKvShape& kv, void* workspace,
                   std::vector<paged::RepackParams>* launches) {
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const int64_t hk = x.kv_heads, d = x.head_dim;
  for (int64_t first = 0; first < x.b; first += paged::kRepackMaxSeqs) {
    const int64_t n = std::min<int64_t>(paged::kRepackMaxSeqs, x.b - first);
    if (x.cu_v[first + n] - x.cu_v[first] > INT32_MAX) {
      return Status::Unsupported("seq_lens: more than 2^31 cached tokens in " +
                                 std::to_string(paged::kRepackMaxSeqs) + " sequences");
    }
    paged::RepackParams p{};
    p.k = paged::cache_side<paged::RepackSide>(cache.k_data, cache.k_scales, cache.k_global);
    p.v = paged::cache_side<paged::RepackSide>(cache.v_data, cache.v_scales, cache.v_global);
    p.block_tables = block_tables.as<const int32_t>();
    p.bt_s0 = block_tables.stride[0];
    p.bt_s1 = block_tables.stride[1];
    p.bt_row0 = first;
    p.page_size = static_cast<int32_t>(kv.page_size);
    p.num_pages = static_cast<int32_t>(kv.num_pages);
    p.kv_heads = static_cast<int32_t>(hk);
    p.nseq = static_cast<int32_t>(n);
    p.k_out = ws + x.k_data + x.cu_k[first] * hk * d;
    p.k_scale_out = reinterpret_cast<float*>(ws + x.k_scale) + x.cu_k_tiles[first] * hk;
    p.v_out = ws + x.v_data + x.cu_v[first] * hk * d;
    p.v_scale_out = reinterpret_cast<float*>(ws + x.v_scale) + first * hk * d;
    for (int64_t i = 0; i <= n; ++i) {
      p.cu_tiles[i] = static_cast<int32_t>(x.cu_k_tiles[first + i] - x.cu_k_tiles[first]);
      p.cu_k[i] = static_cast<int32_t>(x.cu_k[first + i] - x.cu_k[first]);
      p.cu_v[i] = static_cast<int32_t>(x.cu_v[first + i] - x.cu_v[first]);
    }
    launches->push_back(p);
  }
  return Status::Ok();
}

Status launch_repack(const std::vector<paged::RepackParams>& launches, const PagedKvCache& cache,
                     int64_t d, cudaStream_t stream) {
  for (const paged::RepackParams& p : launches) {
    FP4ATTN_RETURN_IF_ERROR(paged::launch_prefill_repack(p, cache.format == KvCacheFormat::kNvfp4,
                                                         static_cast<int>(d), stream));
  }
  return Status::Ok();
}

// One engine launch: sequences [first, first + n) with equal n_q > 0 and L.
struct Run {
  int64_t first, n;
  ForwardOperands in;
  TensorView q, o, lse;
};

}  // namespace

Status paged_prefill_workspace_bytes(const TensorView& cu_seqlens_q_host,
                                     const TensorView& seq_lens_host, int64_t h, int64_t kv_heads,
                                     int64_t head_dim, size_t* bytes) {
  PagedPrefillLayout x;
  FP4ATTN_RETURN_IF_ERROR(
      paged_prefill_layout(cu_seqlens_q_host, seq_lens_host, h, kv_heads, head_dim, &x));
  *bytes = static_cast<size_t>(x.bytes);
  return Status::Ok();
}

Status paged_prefill_repack_cuda(const PagedKvCache& cache, const TensorView& block_tables,
                                 const TensorView& block_tables_host,
                                 const PagedPrefillLayout& layout, void* workspace,
                                 cudaStream_t stream) {
  PagedKvShape kv{};
  FP4ATTN_RETURN_IF_ERROR(check_repack(cache, block_tables, block_tables_host, layout, &kv));
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0) {
    return Status::Invalid("workspace: expected a 256-byte aligned device pointer");
  }
  std::vector<paged::RepackParams> launches;
  FP4ATTN_RETURN_IF_ERROR(plan_repack(cache, block_tables, layout, kv, workspace, &launches));
  return launch_repack(launches, cache, kv.head_dim, stream);
}

Status paged_prefill_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                          const PagedKvCache& cache, const TensorView& block_tables,
                          const TensorView& seq_lens, const PagedAttentionOptions& opt,
                          const TensorView& o, const TensorView& lse,
                          const PagedPrefillCudaOptions& copt, cudaStream_t stream) {
  // ---- shapes, dtypes, options ----
  PagedKvShape kv{};
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {64, 128}, /*writable=*/false, &kv));
  PagedQueryShape qs{};
  FP4ATTN_RETURN_IF_ERROR(
      validate_paged_attention(q, cu_seqlens_q, block_tables, seq_lens, o, lse, kv, &qs));
  if (!qs.varlen) {
    return Status::Unsupported(
        "q: paged prefill takes a varlen q (total_q, heads, head_dim) with cu_seqlens_q (a "
        "rank-4 q can be viewed as one when its batch stride is s_q times its token stride)");
  }
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16) {
    return Status::Unsupported(std::string("q: dtype ") + dtype_name(q.dtype) +
                               " is not supported by the GPU prefill (BF16, FP16)");
  }
  if (o.dtype != DType::kBF16 && o.dtype != DType::kF16) {
    return Status::Unsupported(std::string("o: dtype ") + dtype_name(o.dtype) +
                               " is not supported by the GPU prefill (BF16, FP16)");
  }
  if (lse.defined() && lse.dtype != DType::kF32) {
    return Status::Unsupported(std::string("lse: dtype ") + dtype_name(lse.dtype) +
                               " is not supported by the GPU prefill (F32)");
  }
  if (!paged_prefill_q_recipe_supported(copt.q_recipe)) {
    return Status::Unsupported(std::string("copt.q_recipe: '") + recipe_name(copt.q_recipe) +
                               "' is not supported for paged prefill (fp8, nvfp4)");
  }
  double scale = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, kv.head_dim, &scale));

  // ---- host copies, values, layout ----
  FP4ATTN_RETURN_IF_ERROR(check_host_copy(copt.seq_lens_host, seq_lens, "copt.seq_lens_host"));
  FP4ATTN_RETURN_IF_ERROR(
      check_host_copy(copt.cu_seqlens_q_host, cu_seqlens_q, "copt.cu_seqlens_q_host"));
  FP4ATTN_RETURN_IF_ERROR(
      check_host_copy(copt.block_tables_host, block_tables, "copt.block_tables_host"));
  FP4ATTN_RETURN_IF_ERROR(validate_paged_indices(copt.cu_seqlens_q_host, copt.block_tables_host,
                                                 copt.seq_lens_host, kv, qs));
  PagedPrefillLayout x;
  FP4ATTN_RETURN_IF_ERROR(paged_prefill_layout(copt.cu_seqlens_q_host, copt.seq_lens_host, qs.h,
                                               kv.kv_heads, kv.head_dim, &x));
  FP4ATTN_RETURN_IF_ERROR(check_repack(cache, block_tables, copt.block_tables_host, x, &kv));
  if (copt.workspace != nullptr) {
    if (copt.workspace_bytes < static_cast<size_t>(x.bytes)) {
      return Status::Invalid("copt.workspace_bytes: " + std::to_string(copt.workspace_bytes) +
                             " bytes, need " + std::to_string(x.bytes) +
                             " (paged_prefill_workspace_bytes)");
    }
    if (reinterpret_cast<uintptr_t>(copt.workspace) % kWorkspaceAlign != 0) {
      return Status::Invalid("copt.workspace: expected a 256-byte aligned device pointer");
    }
  }
  if (qs.total_q == 0 || qs.h == 0) return Status::Ok();
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());

  // ---- the engine launches, every view checked before anything runs ----
  // Views are built against a placeholder base (aligned like the workspace) and rebased later.
  uint8_t* const kBase = reinterpret_cast<uint8_t*>(uintptr_t{1} << 20);
  ForwardOptions fopt;
  fopt.recipe = copt.q_recipe;
  fopt.softmax_scale = static_cast<float>(scale);
  fopt.causal = opt.causal;
  const int64_t h = qs.h, d = qs.d;
  const int es_q = dtype_size(q.dtype), es_o = dtype_size(o.dtype);
  std::vector<Run> runs;
  for (int64_t i = 0; i < x.b;) {
    int64_t j = i + 1;
    while (j < x.b && x.n_q(j) == x.n_q(i) && x.len(j) == x.len(i)) ++j;
    const int64_t nq = x.n_q(i), n = j - i, q0 = x.cu_q[i];
    if (nq > 0) {
      Run r{i, n, paged_prefill_operands(x, kBase, i, n), {}, {}, {}};
      r.q = make_strided_view(static_cast<uint8_t*>(q.data) + q0 * q.stride[0] * es_q, q.dtype,
                              {n, nq, h, d}, {nq * q.stride[0], q.stride[0], q.stride[1], 1});
      r.o = make_strided_view(static_cast<uint8_t*>(o.data) + q0 * o.stride[0] * es_o, o.dtype,
                              {n, nq, h, d}, {nq * o.stride[0], o.stride[0], o.stride[1], 1});
      if (lse.defined()) {
        r.lse = make_strided_view(lse.as<float>() + q0 * lse.stride[1], DType::kF32, {n, h, nq},
                                  {nq * lse.stride[1], lse.stride[0], lse.stride[1]});
      }
      FP4ATTN_RETURN_IF_ERROR(validate_operand(r.q, copt.q_recipe, OperandRole::kQ,
                                               OperandOptions{}, r.in.q_data, r.in.q_scale,
                                               TensorView{}, {DType::kBF16, DType::kF16}));
      if (reinterpret_cast<uintptr_t>(r.q.data) % 16 != 0 || (n > 1 && r.q.stride[0] % 8 != 0) ||
          (nq > 1 && r.q.stride[1] % 8 != 0) || (h > 1 && r.q.stride[2] % 8 != 0)) {
        return Status::Unsupported(
            "q: the operand quantizer reads 16-byte vectors: the data address must be 16-byte "
            "aligned and the token and head strides multiples of 8 elements");
      }
      ForwardShape sh;
      FP4ATTN_RETURN_IF_ERROR(validate_forward_operands(r.in, fopt, r.o, r.lse, &sh));
      runs.push_back(r);
    }
    i = j;
  }
  std::vector<paged::RepackParams> launches;

  // ---- launches ----
  void* ws = copt.workspace;
  const bool own = ws == nullptr;
  if (own) {
    FP4ATTN_RETURN_IF_ERROR(cuda_status(
        cudaMallocAsync(&ws, static_cast<size_t>(std::max<int64_t>(x.bytes, kWorkspaceAlign)),
                        stream),
        "workspace"));
  }
  Status st = plan_repack(cache, block_tables, x, kv, ws, &launches);
  if (st.ok()) st = launch_repack(launches, cache, kv.head_dim, stream);
  for (const Run& r0 : runs) {
    if (!st.ok()) break;
    const Run r{r0.first, r0.n, paged_prefill_operands(x, ws, r0.first, r0.n), r0.q, r0.o, r0.lse};
    st = quantize_operand_cuda(r.q, copt.q_recipe, OperandRole::kQ, OperandOptions{}, r.in.q_data,
                               r.in.q_scale, TensorView{}, stream);
    if (st.ok()) st = attention_forward_operands_cuda(r.in, fopt, r.o, r.lse, stream);
    if (!st.ok()) {
      st = Status::Invalid("sequences " + std::to_string(r.first) + ".." +
                           std::to_string(r.first + r.n - 1) + ": " + st.message());
    }
  }
  if (own) {
    const cudaError_t e = cudaFreeAsync(ws, stream);
    if (st.ok()) st = cuda_status(e, "workspace");
  }
  return st;
}

}  // namespace fp4attn
