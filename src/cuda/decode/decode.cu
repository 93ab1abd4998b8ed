// paged_attention_cuda and friends (paged_attention_cuda.h): the host checks (validate_paged.h,
// then what the kernels need of the device views), the split plan, and the launches on the
// caller's stream: the decode kernel (decode_kernel.cuh) alone; in split mode the same kernel
// merges the splits (its fused combine, after a memset of the counters unless the workspace is
// known clean), or, beyond kFusedMaxSplits, the combine kernel (combine.cuh) follows it. Nothing
// synchronizes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/decode/combine.cuh"
#include "cuda/decode/config.h"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/decode/params.h"
#include "cuda/paged/cache_side.h"
#include "cuda/sm90/cuda_status.h"
#include "fp4attn/paged_attention_cuda.h"
#include "validate/paged_launch_checks.h"
#include "validate/validate_attention.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

using paged::CombineParams;
using paged::DecodeParams;
using paged::DecodeSide;

// The split plan's model (docs/kernels/decode.md: the split plan, the fused combine): CTAs of
// one launch run in waves of kSms * ctas_per_sm resident CTAs (ctas_per_sm: the kernel's
// __launch_bounds__ minimum, which its registers allow; shared memory allows more), each CTA costs
// kCtaFixedKeys key-equivalents (its prologue's dependent round trips, the merge and the partial
// write) plus its split's keys, and a split adds the fused combine on the last arriving CTA of each
// group: kCombineKeys (the arrival's fence and atomic, the LSE load, the folds) +
// kCombineKeysPerSplit per split (one L2 round trip per 16 splits), so a plan of n splits costs
// ceil(pairs * n / slots) * (kCtaFixedKeys + split_size) + [n > 1] (kCombineKeys +
// n * kCombineKeysPerSplit); the cheapest n wins, fewer on a tie. (Key-equivalents: ~29 ns per
// key and CTA at 4 CTAs/SM, the b = 32 fit. The fixed terms are estimates from the code,
// unverified.)
constexpr int64_t kSms = 132;  // H200
constexpr int64_t kCtaFixedKeys = 224;
constexpr int64_t kCombineKeys = 64;
constexpr int64_t kCombineKeysPerSplit = 2;
constexpr int64_t kMinSplitKeys = 256;
constexpr int64_t kSplitAlign = 64;
constexpr int64_t kMaxGridYz = 65535;

Status cuda_status(cudaError_t e, const char* what) {
  return sm90::cuda_status(e, "paged_attention_cuda", what);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The 16-row blocks per (sequence, kv head) in the grid: varlen without host copies (max_sq < 0)
// takes one, the CTA loops over the rest.
int64_t row_blocks_of(int64_t max_sq, int64_t group) {
  return max_sq < 0 ? 1 : std::max<int64_t>(1, ceil_div(max_sq * group, 16));
}
// Every sequence has <= 8 query rows per kv head: the transposed kernel.
bool transposed_of(int64_t max_sq, int64_t group) { return max_sq >= 0 && max_sq * group <= 8; }

// The kernel adds 32-bit offsets inside a page (token and head strides, the lane's chunk): the
// largest must fit.
Status check_in_page(const TensorView& t, const char* name) {
  if (!t.defined()) return Status::Ok();
  const int64_t last = (t.shape[1] - 1) * t.stride[1] + (t.shape[2] - 1) * t.stride[2] + t.shape[3];
  if (last <= INT32_MAX) return Status::Ok();
  return Status::Unsupported(std::string(name) + ": offsets inside a page reach " +
                             std::to_string(last) +
                             " bytes; the decode kernel needs them below 2^31 (token and head "
                             "strides)");
}

// Everything the launches need, checked.
struct Plan {
  PagedKvShape kv;
  PagedQueryShape qs;
  DecodeParams p;
  int64_t max_len;  // from seq_lens_host, else max_pages * page_size
  int64_t max_sq;   // the longest query chunk; -1: varlen without host copies (unknown)
  int64_t row_blocks;
  bool transposed;  // every sequence has <= 8 rows per kv head: the transposed kernel
};

Status prepare(const TensorView& q, const TensorView& cu_seqlens_q, const PagedKvCache& cache,
               const TensorView& block_tables, const TensorView& seq_lens,
               const PagedAttentionOptions& opt, const TensorView& o, const TensorView& lse,
               const PagedAttentionCudaOptions& copt, Plan* plan) {
  PagedKvShape& kv = plan->kv;
  PagedQueryShape& qs = plan->qs;
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {64, 128}, /*writable=*/false, &kv));
  FP4ATTN_RETURN_IF_ERROR(
      validate_paged_attention(q, cu_seqlens_q, block_tables, seq_lens, o, lse, kv, &qs));
  if (q.dtype != DType::kBF16) {
    return Status::Unsupported(std::string("q: dtype ") + dtype_name(q.dtype) +
                               " is not supported by the GPU decode (BF16; the golden model also "
                               "takes FP16/F32/F64)");
  }
  if (o.defined() && o.dtype != DType::kBF16) {
    return Status::Unsupported(std::string("o: dtype ") + dtype_name(o.dtype) +
                               " is not supported by the GPU decode (BF16)");
  }
  if (lse.defined() && lse.dtype != DType::kF32) {
    return Status::Unsupported(std::string("lse: dtype ") + dtype_name(lse.dtype) +
                               " is not supported by the GPU decode (F32)");
  }
  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  const int vec = fp4 ? static_cast<int>(kv.head_dim / 8) : 16;
  FP4ATTN_RETURN_IF_ERROR(paged::check_vector_view(cache.k_data, "k_cache", vec, "decode"));
  FP4ATTN_RETURN_IF_ERROR(paged::check_vector_view(cache.v_data, "v_cache", vec, "decode"));
  FP4ATTN_RETURN_IF_ERROR(check_in_page(cache.k_data, "k_cache"));
  FP4ATTN_RETURN_IF_ERROR(check_in_page(cache.v_data, "v_cache"));
  FP4ATTN_RETURN_IF_ERROR(check_in_page(cache.k_scales, "k_scales"));
  FP4ATTN_RETURN_IF_ERROR(check_in_page(cache.v_scales, "v_scales"));
  // The NVFP4 ring forms a page's address as a 32 x 32 -> 64-bit product.
  for (const TensorView* t : {&cache.k_data, &cache.v_data, &cache.k_scales, &cache.v_scales}) {
    if (t->defined() && t->stride[0] > UINT32_MAX) {
      return Status::Unsupported("paged cache: a page stride of " + std::to_string(t->stride[0]) +
                                 " bytes; the decode kernel needs page strides below 2^32");
    }
  }
  double scale = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, kv.head_dim, &scale));

  // Host copies of the indices: the golden's value checks.
  const bool have_host = copt.block_tables_host.defined() || copt.seq_lens_host.defined() ||
                         copt.cu_seqlens_q_host.defined();
  plan->max_len = qs.max_pages * kv.page_size;
  int64_t max_sq = qs.varlen ? -1 : qs.s_q;
  if (have_host) {
    FP4ATTN_RETURN_IF_ERROR(paged::check_host_copy_like(copt.block_tables_host, block_tables,
                                                        "copt.block_tables_host"));
    FP4ATTN_RETURN_IF_ERROR(
        paged::check_host_copy_like(copt.seq_lens_host, seq_lens, "copt.seq_lens_host"));
    if (qs.varlen) {
      FP4ATTN_RETURN_IF_ERROR(paged::check_host_copy_like(copt.cu_seqlens_q_host, cu_seqlens_q,
                                                          "copt.cu_seqlens_q_host"));
    }
    FP4ATTN_RETURN_IF_ERROR(validate_paged_indices(copt.cu_seqlens_q_host, copt.block_tables_host,
                                                   copt.seq_lens_host, kv, qs));
    const TensorView& sl = copt.seq_lens_host;
    plan->max_len = 0;
    for (int64_t bi = 0; bi < qs.b; ++bi) {
      plan->max_len = std::max<int64_t>(plan->max_len, sl.as<const int32_t>()[bi * sl.stride[0]]);
    }
    if (qs.varlen) {
      const TensorView& cu = copt.cu_seqlens_q_host;
      const int32_t* c = cu.as<const int32_t>();
      for (int64_t bi = 0; bi < qs.b; ++bi) {
        max_sq = std::max<int64_t>(max_sq, c[(bi + 1) * cu.stride[0]] - c[bi * cu.stride[0]]);
      }
    }
  }
  const int64_t group = qs.h / kv.kv_heads;
  plan->max_sq = max_sq;
  plan->row_blocks = row_blocks_of(max_sq, group);
  plan->transposed = transposed_of(max_sq, group);
  if (kv.kv_heads * plan->row_blocks > kMaxGridYz || qs.b > kMaxGridYz) {
    return Status::Unsupported("q: batch " + std::to_string(qs.b) + " or kv_heads x row blocks " +
                               std::to_string(kv.kv_heads * plan->row_blocks) +
                               " exceeds the grid limit of 65535");
  }
  if (qs.total_q * qs.h * kv.head_dim >= (int64_t{1} << 40)) {
    return Status::Unsupported("q: too large");
  }

  DecodeParams& p = plan->p;
  p = DecodeParams{};
  p.q = static_cast<const uint16_t*>(q.data);
  if (qs.varlen) {
    p.q_sb = q.stride[0];
    p.q_si = 0;
    p.q_sh = q.stride[1];
    p.s_q = 0;
    p.cu_seqlens_q = cu_seqlens_q.as<const int32_t>();
  } else {
    p.q_sb = q.stride[0];
    p.q_si = q.stride[1];
    p.q_sh = q.stride[2];
    p.s_q = static_cast<int32_t>(qs.s_q);
  }
  p.total_q = qs.total_q;
  p.k = paged::cache_side<DecodeSide>(cache.k_data, cache.k_scales, cache.k_global);
  p.v = paged::cache_side<DecodeSide>(cache.v_data, cache.v_scales, cache.v_global);
  p.block_tables = block_tables.as<const int32_t>();
  p.bt_s0 = block_tables.stride[0];
  p.bt_s1 = block_tables.stride[1];
  p.seq_lens = seq_lens.as<const int32_t>();
  p.page_size = static_cast<int32_t>(kv.page_size);
  p.page_shift = -1;
  for (int s = 0; s < 31; ++s) {
    if ((int64_t{1} << s) == kv.page_size) p.page_shift = s;
  }
  p.pages16 = kv.page_size % 16 == 0;
  p.k_scales_u16 = p.k.scales != nullptr && reinterpret_cast<uintptr_t>(p.k.scales) % 2 == 0 &&
                   p.k.scales_s[0] % 2 == 0 && p.k.scales_s[1] % 2 == 0 && p.k.scales_s[2] % 2 == 0;
  auto scales_vec = [&](const DecodeSide& sd) {
    const int64_t v = kv.head_dim / 16;
    return sd.scales != nullptr && reinterpret_cast<uintptr_t>(sd.scales) % v == 0 &&
           sd.scales_s[0] % v == 0 && sd.scales_s[1] % v == 0 && sd.scales_s[2] % v == 0;
  };
  p.scales_vec = scales_vec(p.k) && scales_vec(p.v);
  p.num_pages = static_cast<int32_t>(kv.num_pages);
  p.max_pages = static_cast<int32_t>(std::min<int64_t>(qs.max_pages, INT32_MAX));
  p.h = static_cast<int32_t>(qs.h);
  p.group = static_cast<int32_t>(group);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.causal = opt.causal;
  p.row_blocks = static_cast<int32_t>(plan->row_blocks);
  p.error_flag = copt.error_flag;
  return Status::Ok();
}

template <int D, bool kFp4, bool kT>
void launch_decode_t(const DecodeParams& p, int64_t kv_heads, int64_t b, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(kv_heads * p.row_blocks), static_cast<unsigned>(b));
  paged::paged_decode_kernel<D, kFp4, kT>
      <<<grid, paged::kDecodeThreads, paged::decode_smem_bytes<D, kT, kFp4>(), stream>>>(p);
}

template <bool kT>
void launch_decode_rows(const Plan& plan, const DecodeParams& p, bool fp4, cudaStream_t stream) {
  const int64_t kvh = plan.kv.kv_heads, b = plan.qs.b;
  if (plan.kv.head_dim == 128) {
    fp4 ? launch_decode_t<128, true, kT>(p, kvh, b, stream)
        : launch_decode_t<128, false, kT>(p, kvh, b, stream);
  } else {
    fp4 ? launch_decode_t<64, true, kT>(p, kvh, b, stream)
        : launch_decode_t<64, false, kT>(p, kvh, b, stream);
  }
}

void launch_decode(const Plan& plan, const DecodeParams& p, bool fp4, cudaStream_t stream) {
  plan.transposed ? launch_decode_rows<true>(plan, p, fp4, stream)
                  : launch_decode_rows<false>(plan, p, fp4, stream);
}

void launch_combine(const CombineParams& c, cudaStream_t stream) {
  const int64_t items = c.total_q * c.h;
  if (items == 0) return;
  // One CTA per item (the kernel loops when there are more).
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(items, int64_t{1} << 24));
  paged::combine_partials_kernel<<<grid, paged::kCombineThreads, 0, stream>>>(c);
}

bool empty_problem(const Plan& plan) { return plan.qs.b == 0 || plan.qs.total_q == 0; }

// The most splits the decode kernel that runs can merge itself (kFusedMaxSplits); beyond, the
// combine kernel runs after it.
int fused_max_splits(const Plan& plan, bool fp4) {
  const bool t = plan.transposed;
  if (plan.kv.head_dim == 128) {
    return fp4 ? (t ? paged::kFusedMaxSplits<128, true, true>
                    : paged::kFusedMaxSplits<128, false, true>)
               : (t ? paged::kFusedMaxSplits<128, true, false>
                    : paged::kFusedMaxSplits<128, false, false>);
  }
  return fp4 ? (t ? paged::kFusedMaxSplits<64, true, true>
                  : paged::kFusedMaxSplits<64, false, true>)
             : (t ? paged::kFusedMaxSplits<64, true, false>
                  : paged::kFusedMaxSplits<64, false, false>);
}

}  // namespace

int paged_decode_ctas_per_sm(int64_t head_dim, bool nvfp4, int64_t rows_per_kv_head) {
  const bool t = rows_per_kv_head <= 8;
  if (head_dim == 64) {
    return t ? paged::kDecodeMinBlocks<64, true, true> : paged::kDecodeMinBlocks<64, true, false>;
  }
  if (nvfp4) {
    return t ? paged::kDecodeMinBlocks<128, true, true> : paged::kDecodeMinBlocks<128, true, false>;
  }
  return t ? paged::kDecodeMinBlocks<128, false, true> : paged::kDecodeMinBlocks<128, false, false>;
}

void paged_attention_split_plan(int64_t b, int64_t kv_heads, int64_t row_blocks, int64_t max_len,
                                int forced, int64_t* num_splits, int64_t* split_size,
                                int ctas_per_sm) {
  max_len = std::max<int64_t>(max_len, 1);
  int64_t size = ceil_div(max_len, kSplitAlign) * kSplitAlign;
  if (forced >= 1) {
    size = ceil_div(ceil_div(max_len, forced), kSplitAlign) * kSplitAlign;
  } else if (max_len > 512 && b * kv_heads * row_blocks < kSms * std::max(ctas_per_sm, 1)) {
    // (A full machine does not split: the last wave's CTAs share their SMs with fewer others and
    // run faster than the model's waves assume, and the partials would cost a round trip.)
    const int64_t pairs = std::max<int64_t>(b * kv_heads * row_blocks, 1);
    const int64_t slots = kSms * std::max(ctas_per_sm, 1);
    const int64_t n_max = std::max<int64_t>(max_len / kMinSplitKeys, 1);
    int64_t best_cost = -1;
    for (int64_t n = 1; n <= n_max; ++n) {
      const int64_t sz = ceil_div(ceil_div(max_len, n), kSplitAlign) * kSplitAlign;
      const int64_t n_real = ceil_div(max_len, sz);
      const int64_t ctas = pairs * n_real;
      const int64_t cost = ceil_div(ctas, slots) * (kCtaFixedKeys + sz) +
                           (n_real > 1 ? kCombineKeys + n_real * kCombineKeysPerSplit : 0);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        size = sz;
      }
    }
  }
  *split_size = size;
  *num_splits = ceil_div(max_len, size);
}

namespace {
size_t round256(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

// Layout: O partials, LSE partials, the fused combine's counters (one int per (row, head) item),
// each 256-byte aligned.
size_t paged_attention_workspace_bytes(int64_t num_splits, int64_t total_q, int64_t h, int64_t d) {
  if (num_splits <= 1) return 0;
  const size_t o_bytes = sizeof(float) * num_splits * total_q * h * d;
  const size_t l_bytes = sizeof(float) * num_splits * total_q * h;
  return round256(o_bytes) + round256(l_bytes) + sizeof(int32_t) * total_q * h;
}

PagedDecodeSchedule paged_decode_schedule(int64_t b, int64_t total_q, int64_t h, int64_t kv_heads,
                                          int64_t head_dim, bool nvfp4, int64_t max_s_q,
                                          int64_t max_len, int forced) {
  PagedDecodeSchedule s;
  const int64_t group = std::max<int64_t>(h / std::max<int64_t>(kv_heads, 1), 1);
  const bool transposed = transposed_of(max_s_q, group);
  paged_attention_split_plan(b, kv_heads, row_blocks_of(max_s_q, group), max_len, forced,
                             &s.num_splits, &s.split_size,
                             paged_decode_ctas_per_sm(head_dim, nvfp4, transposed ? 8 : 16));
  s.workspace_bytes = paged_attention_workspace_bytes(s.num_splits, total_q, h, head_dim);
  return s;
}

Status paged_attention_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                            const PagedKvCache& cache, const TensorView& block_tables,
                            const TensorView& seq_lens, const PagedAttentionOptions& opt,
                            const TensorView& o, const TensorView& lse,
                            const PagedAttentionCudaOptions& copt, cudaStream_t stream) {
  Plan plan;
  FP4ATTN_RETURN_IF_ERROR(
      prepare(q, cu_seqlens_q, cache, block_tables, seq_lens, opt, o, lse, copt, &plan));
  if (copt.num_splits < 0) {
    return Status::Invalid("copt.num_splits: expected >= 0, got " +
                           std::to_string(copt.num_splits));
  }
  if (empty_problem(plan)) return Status::Ok();
  const PagedDecodeSchedule sched = paged_decode_schedule(
      plan.qs.b, plan.qs.total_q, plan.qs.h, plan.kv.kv_heads, plan.kv.head_dim,
      cache.format == KvCacheFormat::kNvfp4, plan.max_sq, plan.max_len, copt.num_splits);
  const int64_t splits = sched.num_splits;
  DecodeParams p = plan.p;
  p.split_size = static_cast<int32_t>(sched.split_size);
  p.num_splits = static_cast<int32_t>(splits);
  p.split_per_seq = true;
  const bool fp4 = cache.format == KvCacheFormat::kNvfp4;
  const bool varlen = plan.qs.varlen;
  // Output strides as (batch or row, token, head).
  p.o = static_cast<uint16_t*>(o.data);
  p.o_sb = o.stride[0];
  p.o_si = varlen ? 0 : o.stride[1];
  p.o_sh = varlen ? o.stride[1] : o.stride[2];
  p.lse = lse.defined() ? lse.as<float>() : nullptr;
  if (lse.defined()) {
    // rank 4: lse [b, h, s_q]; varlen: [h, total_q].
    p.l_sb = varlen ? lse.stride[1] : lse.stride[0];
    p.l_si = varlen ? 0 : lse.stride[2];
    p.l_sh = varlen ? lse.stride[0] : lse.stride[1];
  }
  if (splits == 1) {
    p.write_partials = false;
    launch_decode(plan, p, fp4, stream);
    return cuda_status(cudaGetLastError(), "decode launch");
  }

  const int64_t h = plan.qs.h, d = plan.kv.head_dim, tq = plan.qs.total_q;
  const size_t need = sched.workspace_bytes;
  void* ws = copt.workspace;
  bool owned = false;
  if (ws != nullptr) {
    if (copt.workspace_bytes < need) {
      return Status::Invalid("copt.workspace_bytes: " + std::to_string(copt.workspace_bytes) +
                             " bytes, " + std::to_string(need) + " needed for " +
                             std::to_string(splits) + " splits");
    }
    if (reinterpret_cast<uintptr_t>(ws) % 16 != 0) {
      return Status::Invalid("copt.workspace: must be 16-byte aligned");
    }
  } else {
    FP4ATTN_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(&ws, need, stream), "cudaMallocAsync"));
    owned = true;
  }
  p.write_partials = true;
  const size_t o_bytes = round256(sizeof(float) * splits * tq * h * d);
  p.o_part = static_cast<float*>(ws);
  p.lse_part = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + o_bytes);
  int32_t* counters = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(ws) + o_bytes +
                                                 round256(sizeof(float) * splits * tq * h));
  CombineParams c{};
  c.o_part = p.o_part;
  c.op_s[0] = tq * h * d;
  c.op_s[1] = h * d;
  c.op_s[2] = d;
  c.lse_part = p.lse_part;
  c.lp_s[0] = tq * h;
  c.lp_s[1] = h;
  c.lp_s[2] = 1;
  c.splits = static_cast<int32_t>(splits);
  c.h = static_cast<int32_t>(h);
  c.d = static_cast<int32_t>(d);
  c.total_q = tq;
  c.s_q = varlen ? 0 : static_cast<int32_t>(plan.qs.s_q);
  c.o = p.o;
  c.o_sb = p.o_sb;
  c.o_si = p.o_si;
  c.o_sh = p.o_sh;
  c.lse = p.lse;
  c.l_sb = p.l_sb;
  c.l_si = p.l_si;
  c.l_sh = p.l_sh;
  // Fused: the last CTA of each group merges it, one launch. The counters must be zero at
  // the start: a launch that completes leaves them zero; one that faults leaves the context
  // unusable (a sticky error), so no later launch can see them dirty. A fresh or foreign
  // workspace is zeroed here unless the caller says it holds only our zeros
  // (copt.workspace_is_clean).
  Status st = Status::Ok();
  const bool fused = splits <= fused_max_splits(plan, fp4);
  if (fused) {
    p.counters = counters;
    p.comb = c;
    if (owned || !copt.workspace_is_clean) {
      st = cuda_status(cudaMemsetAsync(counters, 0, sizeof(int32_t) * tq * h, stream),
                       "cudaMemsetAsync");
    }
  }
  if (st.ok()) {
    launch_decode(plan, p, fp4, stream);
    st = cuda_status(cudaGetLastError(), "decode launch");
  }
  if (st.ok() && !fused) {
    launch_combine(c, stream);
    st = cuda_status(cudaGetLastError(), "combine launch");
  }
  if (owned) {
    const Status freed = cuda_status(cudaFreeAsync(ws, stream), "cudaFreeAsync");
    if (st.ok()) st = freed;
  }
  return st;
}

Status paged_attention_partials_cuda(const TensorView& q, const TensorView& cu_seqlens_q,
                                     const PagedKvCache& cache, const TensorView& block_tables,
                                     const TensorView& seq_lens, const PagedAttentionOptions& opt,
                                     int64_t split_size, const TensorView& o_partial,
                                     const TensorView& lse_partial,
                                     const PagedAttentionCudaOptions& copt, cudaStream_t stream) {
  FP4ATTN_RETURN_IF_ERROR(
      validate_partials(o_partial, lse_partial, {DType::kF32}, /*writable=*/true));
  Plan plan;
  FP4ATTN_RETURN_IF_ERROR(prepare(q, cu_seqlens_q, cache, block_tables, seq_lens, opt, TensorView{},
                                  TensorView{}, copt, &plan));
  const int64_t splits = o_partial.shape[0], h = plan.qs.h, d = plan.kv.head_dim;
  const int64_t tq = plan.qs.total_q;
  if (o_partial.shape[1] != tq || o_partial.shape[2] != h || o_partial.shape[3] != d) {
    return Status::Invalid("o_partial: expected shape (num_splits, " + std::to_string(tq) + ", " +
                           std::to_string(h) + ", " + std::to_string(d) + ") for q, got " +
                           o_partial.shape_str());
  }
  if (!o_partial.is_contiguous() || !lse_partial.is_contiguous()) {
    return Status::Unsupported("o_partial/lse_partial: the GPU decode writes contiguous partials");
  }
  const bool per_seq = split_size == 0;
  if (!per_seq && (split_size < 16 || split_size % 16 != 0 || split_size > INT32_MAX)) {
    return Status::Invalid(
        "split_size: expected 0 (per sequence) or a positive multiple of 16, "
        "got " +
        std::to_string(split_size));
  }
  if (splits < 1 || splits > kMaxGridYz) {
    return Status::Invalid("o_partial: num_splits " + std::to_string(splits) +
                           " must be in [1, 65535]");
  }
  if (!per_seq && plan.max_len > splits * split_size) {
    return Status::Invalid(
        "o_partial: " + std::to_string(splits) + " splits of " + std::to_string(split_size) +
        " keys do not cover " +
        (copt.seq_lens_host.defined() ? "the longest sequence (" : "max_pages * page_size (") +
        std::to_string(plan.max_len) + ")");
  }
  if (empty_problem(plan)) return Status::Ok();
  DecodeParams p = plan.p;
  p.split_size = static_cast<int32_t>(split_size);
  p.num_splits = static_cast<int32_t>(splits);
  p.split_per_seq = per_seq;
  p.write_partials = true;
  p.o_part = o_partial.as<float>();
  p.lse_part = lse_partial.as<float>();
  launch_decode(plan, p, cache.format == KvCacheFormat::kNvfp4, stream);
  return cuda_status(cudaGetLastError(), "decode launch");
}

Status combine_attention_partials_cuda(const TensorView& o_partial, const TensorView& lse_partial,
                                       const TensorView& o, const TensorView& lse,
                                       cudaStream_t stream) {
  FP4ATTN_RETURN_IF_ERROR(validate_partials(o_partial, lse_partial, {DType::kF32}, false));
  const int64_t splits = o_partial.shape[0], tq = o_partial.shape[1], h = o_partial.shape[2],
                d = o_partial.shape[3];
  FP4ATTN_RETURN_IF_ERROR(check_rank(o, "o", 3, "(total_q, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(o, "o", {DType::kBF16}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(o, "o"));
  if (o.shape[0] != tq || o.shape[1] != h || o.shape[2] != d) {
    return Status::Invalid("o: expected shape (" + std::to_string(tq) + ", " + std::to_string(h) +
                           ", " + std::to_string(d) + ") like o_partial without its splits, got " +
                           o.shape_str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_output_strides(o, "o"));
  if (lse.defined()) {
    FP4ATTN_RETURN_IF_ERROR(check_rank(lse, "lse", 2, "(heads, total_q)"));
    FP4ATTN_RETURN_IF_ERROR(check_dtype(lse, "lse", {DType::kF32}));
    FP4ATTN_RETURN_IF_ERROR(check_strides(lse, "lse"));
    if (lse.shape[0] != h || lse.shape[1] != tq) {
      return Status::Invalid("lse: expected shape (" + std::to_string(h) + ", " +
                             std::to_string(tq) + ") (heads, total_q), got " + lse.shape_str());
    }
    FP4ATTN_RETURN_IF_ERROR(check_output_strides(lse, "lse"));
  }
  if (splits > INT32_MAX || h > INT32_MAX || d > INT32_MAX) {
    return Status::Unsupported("o_partial: too large");
  }
  if (tq * h == 0 || d == 0) return Status::Ok();
  FP4ATTN_RETURN_IF_ERROR(check_not_null(o_partial, "o_partial"));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(o, "o"));
  CombineParams c{};
  c.o_part = o_partial.as<const float>();
  c.lse_part = lse_partial.as<const float>();
  for (int i = 0; i < 3; ++i) {
    c.op_s[i] = o_partial.stride[i];
    c.lp_s[i] = lse_partial.stride[i];
  }
  c.splits = static_cast<int32_t>(splits);
  c.h = static_cast<int32_t>(h);
  c.d = static_cast<int32_t>(d);
  c.total_q = tq;
  c.s_q = 0;
  c.o = static_cast<uint16_t*>(o.data);
  c.o_sb = o.stride[0];
  c.o_si = 0;
  c.o_sh = o.stride[1];
  c.lse = lse.defined() ? lse.as<float>() : nullptr;
  if (lse.defined()) {
    c.l_sb = lse.stride[1];
    c.l_si = 0;
    c.l_sh = lse.stride[0];
  }
  launch_combine(c, stream);
  return cuda_status(cudaGetLastError(), "combine launch");
}

}  // namespace fp4attn
