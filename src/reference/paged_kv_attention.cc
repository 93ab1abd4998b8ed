// Golden paged attention: float64 softmax attention over the decoded paged cache (decode,
// speculative decode, prefill/extend; GQA; varlen through block tables), whole or as split-KV
// partials. Written for obvious correctness: the values are the codec's, the math is the float64
// reference's (reference.h), so it equals reference_attention_forward on the decoded cache.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "fp4attn/golden/paged_kv.h"
#include "reference/paged_kv_internal.h"
#include "validate/validate_attention.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t at1(const TensorView& t, int64_t i) { return t.as<const int32_t>()[i * t.stride[0]]; }

// Everything a work item needs, validated.
struct Problem {
  const TensorView* q;
  const PagedKvCache* cache;
  const TensorView* block_tables;
  PagedKvShape kv;
  PagedQueryShape qs;
  std::vector<int64_t> q_begin;  // [b + 1]: rows of sequence bi are [q_begin[bi], q_begin[bi+1])
  std::vector<int64_t> len;      // [b]
  double scale;
  bool causal;
  float k_global, v_global;
};

Status prepare(const TensorView& q, const TensorView& cu_seqlens_q, const PagedKvCache& cache,
               const TensorView& block_tables, const TensorView& seq_lens,
               const PagedAttentionOptions& opt, const TensorView& o, const TensorView& lse,
               Problem* p) {
  FP4ATTN_RETURN_IF_ERROR(validate_paged_kv_cache(cache, {}, /*writable=*/false, &p->kv));
  FP4ATTN_RETURN_IF_ERROR(
      validate_paged_attention(q, cu_seqlens_q, block_tables, seq_lens, o, lse, p->kv, &p->qs));
  FP4ATTN_RETURN_IF_ERROR(
      validate_paged_indices(cu_seqlens_q, block_tables, seq_lens, p->kv, p->qs));
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, p->kv.head_dim, &p->scale));
  p->k_global = paged_internal::read_global(cache.k_global);
  p->v_global = paged_internal::read_global(cache.v_global);
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(p->k_global, "k_global"));
  FP4ATTN_RETURN_IF_ERROR(validate_global_scale(p->v_global, "v_global"));
  p->q = &q;
  p->cache = &cache;
  p->block_tables = &block_tables;
  p->causal = opt.causal;
  const int64_t b = p->qs.b;
  p->q_begin.resize(b + 1);
  p->len.resize(b);
  for (int64_t bi = 0; bi <= b; ++bi) {
    p->q_begin[bi] = p->qs.varlen ? at1(cu_seqlens_q, bi) : bi * p->qs.s_q;
    if (bi < b) p->len[bi] = at1(seq_lens, bi);
  }
  return Status::Ok();
}

// Keys [0, result) are visible to query i of s_q over len cached tokens (bottom-right causal).
int64_t visible(const Problem& p, int64_t i, int64_t s_q, int64_t len) {
  if (!p.causal) return len;
  return std::clamp<int64_t>(i + len - s_q + 1, 0, len);
}

// Row r (query token in q's order), query head hq of q, as doubles.
void load_q(const Problem& p, int64_t bi, int64_t r, int64_t hq, double* out) {
  const TensorView& q = *p.q;
  int64_t base;
  if (p.qs.varlen) {
    base = r * q.stride[0] + hq * q.stride[1];
  } else {
    base = bi * q.stride[0] + (r - p.q_begin[bi]) * q.stride[1] + hq * q.stride[2];
  }
  for (int64_t c = 0; c < p.kv.head_dim; ++c) out[c] = load_as_double(q, base + c);
}

// Keys [k0, k1) of sequence bi, kv head hk, decoded: rows of d doubles.
void gather(const Problem& p, bool is_v, int64_t bi, int64_t hk, int64_t k0, int64_t k1,
            std::vector<double>* out) {
  const int64_t d = p.kv.head_dim, ps = p.kv.page_size;
  const TensorView& bt = *p.block_tables;
  out->resize(std::max<int64_t>(k1 - k0, 0) * d);
  std::vector<float> row(d);
  for (int64_t j = k0; j < k1; ++j) {
    const int64_t page = bt.as<const int32_t>()[bi * bt.stride[0] + (j / ps) * bt.stride[1]];
    paged_internal::decode_token(*p.cache, is_v, page, j % ps, hk, d,
                                 is_v ? p.v_global : p.k_global, row.data());
    std::copy(row.begin(), row.end(), out->begin() + (j - k0) * d);
  }
}

// Softmax attention of one query over n keys (n may be 0): out = sum_j p_j v_j / sum_j p_j,
// returns the LSE (natural log), or -inf with out = 0 when n == 0. A NaN score reaches the max
// (and so every p_j and the output), as in the float64 reference.
double attend(const double* q, const double* k, const double* v, int64_t n, int64_t d, double scale,
              double* s, double* out) {
  std::fill(out, out + d, 0.0);
  if (n == 0) return -kInf;
  double m = -kInf;
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t c = 0; c < d; ++c) acc += q[c] * k[j * d + c];
    s[j] = scale * acc;
    if (!(s[j] <= m)) m = s[j];
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    const double w = s[j] / sum;
    for (int64_t c = 0; c < d; ++c) out[c] += w * v[j * d + c];
  }
  return m + std::log(sum);
}

// Runs every (sequence, kv head, split) and hands each (row, query head, split) result to
// sink(r, hq, split, out, lse). Splits cover [split * split_size, (split + 1) * split_size).
template <typename Sink>
void run(const Problem& p, int64_t num_splits, int64_t split_size, Sink&& sink) {
  const int64_t d = p.kv.head_dim, h_kv = p.kv.kv_heads, group = p.qs.h / h_kv;
  parallel_for(p.qs.b * h_kv * num_splits, [&](int64_t item) {
    const int64_t split = item % num_splits, hk = (item / num_splits) % h_kv;
    const int64_t bi = item / num_splits / h_kv;
    const int64_t len = p.len[bi], r0 = p.q_begin[bi], r1 = p.q_begin[bi + 1];
    const int64_t k0 = std::min(len, split * split_size);
    const int64_t k1 = std::min(len, k0 + split_size);
    std::vector<double> kd, vd, qd(d), s(std::max<int64_t>(k1 - k0, 1)), out(d);
    gather(p, false, bi, hk, k0, k1, &kd);
    gather(p, true, bi, hk, k0, k1, &vd);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = std::clamp<int64_t>(visible(p, r - r0, r1 - r0, len) - k0, 0, k1 - k0);
      for (int64_t hq = hk * group; hq < (hk + 1) * group; ++hq) {
        load_q(p, bi, r, hq, qd.data());
        const double lse =
            attend(qd.data(), kd.data(), vd.data(), n, d, p.scale, s.data(), out.data());
        sink(r, hq, split, out.data(), lse);
      }
    }
  });
}

}  // namespace

Status golden_paged_attention(const TensorView& q, const TensorView& cu_seqlens_q,
                              const PagedKvCache& cache, const TensorView& block_tables,
                              const TensorView& seq_lens, const PagedAttentionOptions& opt,
                              const TensorView& o, const TensorView& lse) {
  Problem p;
  FP4ATTN_RETURN_IF_ERROR(prepare(q, cu_seqlens_q, cache, block_tables, seq_lens, opt, o, lse, &p));
  int64_t max_len = 1;
  for (int64_t l : p.len) max_len = std::max(max_len, l);
  run(p, 1, max_len, [&](int64_t r, int64_t hq, int64_t, const double* out, double row_lse) {
    int64_t o_base, lse_off = 0;
    if (p.qs.varlen) {
      o_base = r * o.stride[0] + hq * o.stride[1];
      if (lse.defined()) lse_off = hq * lse.stride[0] + r * lse.stride[1];
    } else {
      const int64_t bi = r / p.qs.s_q, i = r % p.qs.s_q;
      o_base = bi * o.stride[0] + i * o.stride[1] + hq * o.stride[2];
      if (lse.defined()) lse_off = bi * lse.stride[0] + hq * lse.stride[1] + i * lse.stride[2];
    }
    for (int64_t c = 0; c < p.kv.head_dim; ++c) store_from_double(o, o_base + c, out[c]);
    // The user-facing empty row is +inf (FlashAttention's convention), not the partials' -inf.
    if (lse.defined()) store_from_double(lse, lse_off, row_lse == -kInf ? kInf : row_lse);
  });
  return Status::Ok();
}

Status golden_paged_attention_partials(const TensorView& q, const TensorView& cu_seqlens_q,
                                       const PagedKvCache& cache, const TensorView& block_tables,
                                       const TensorView& seq_lens, const PagedAttentionOptions& opt,
                                       int64_t split_size, const TensorView& o_partial,
                                       const TensorView& lse_partial) {
  FP4ATTN_RETURN_IF_ERROR(
      validate_partials(o_partial, lse_partial, {DType::kF32, DType::kF64}, /*writable=*/true));
  Problem p;  // no o or lse: the partials are the outputs
  FP4ATTN_RETURN_IF_ERROR(
      prepare(q, cu_seqlens_q, cache, block_tables, seq_lens, opt, TensorView{}, TensorView{}, &p));
  const int64_t num_splits = o_partial.shape[0];
  if (o_partial.shape[1] != p.qs.total_q || o_partial.shape[2] != p.qs.h ||
      o_partial.shape[3] != p.kv.head_dim) {
    return Status::Invalid("o_partial: expected shape (num_splits, " +
                           std::to_string(p.qs.total_q) + ", " + std::to_string(p.qs.h) + ", " +
                           std::to_string(p.kv.head_dim) + ") for q, got " + o_partial.shape_str());
  }
  if (split_size < 1) {
    return Status::Invalid("split_size: expected >= 1, got " + std::to_string(split_size));
  }
  for (int64_t bi = 0; bi < p.qs.b; ++bi) {
    if (p.len[bi] > num_splits * split_size) {
      return Status::Invalid("o_partial: " + std::to_string(num_splits) + " splits of " +
                             std::to_string(split_size) + " keys do not cover seq_lens[" +
                             std::to_string(bi) + "] = " + std::to_string(p.len[bi]));
    }
  }
  const TensorView &op = o_partial, &lp = lse_partial;
  run(p, num_splits, split_size,
      [&](int64_t r, int64_t hq, int64_t split, const double* out, double row_lse) {
        const int64_t base = split * op.stride[0] + r * op.stride[1] + hq * op.stride[2];
        for (int64_t c = 0; c < p.kv.head_dim; ++c) store_from_double(op, base + c, out[c]);
        store_from_double(lp, split * lp.stride[0] + r * lp.stride[1] + hq * lp.stride[2], row_lse);
      });
  return Status::Ok();
}

}  // namespace fp4attn
