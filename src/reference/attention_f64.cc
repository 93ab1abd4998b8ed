// Float64 golden attention, forward and backward. Simple loops in double: this is the yardstick,
// so it is written for obvious correctness; threads only split independent rows and keys.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "fp4attn/golden/reference.h"
#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Query rows (forward, dq) or keys (dk, dv) per work item: small enough to spread over threads,
// large enough that gathering the other operand into doubles costs little next to the arithmetic.
constexpr int64_t kBlock = 32;

int64_t offset3(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2];
}

// Copies rows [s0, s1) of t[batch, :, head, :] into a dense [s1 - s0][d] buffer of doubles, so the
// inner loops see contiguous doubles whatever the dtype and strides.
void gather_rows(const TensorView& t, int64_t batch, int64_t head, int64_t s0, int64_t s1,
                 std::vector<double>* out) {
  const int64_t d = t.shape[3];
  out->resize(std::max<int64_t>(s1 - s0, 0) * d);
  double* dst = out->data();
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t base = offset3(t, batch, s, head);
    if (t.dtype == DType::kF32) {  // the common case, without a dtype switch per element
      const float* src = t.as<const float>() + base;
      for (int64_t c = 0; c < d; ++c) *dst++ = src[c];
    } else {
      for (int64_t c = 0; c < d; ++c) *dst++ = load_as_double(t, base + c);
    }
  }
}

void scatter_row(const TensorView& t, int64_t batch, int64_t s, int64_t head, const double* row) {
  const int64_t base = offset3(t, batch, s, head);
  for (int64_t c = 0; c < t.shape[3]; ++c) store_from_double(t, base + c, row[c]);
}

// Keys [0, result) are visible to query row i. Causal is aligned bottom-right (FlashAttention).
int64_t visible_keys(const AttentionShape& sh, bool causal, int64_t i) {
  if (!causal) return sh.s_k;
  return std::clamp<int64_t>(i + sh.s_k - sh.s_q + 1, 0, sh.s_k);
}

// Four partial sums in a fixed order: lets the compiler use SIMD and overlap the adds (a single
// running sum cannot be reordered without -ffast-math), while staying deterministic.
double dot(const double* a, const double* b, int64_t d) {
  double acc[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= d; c += 4) {
    for (int u = 0; u < 4; ++u) acc[u] += a[c + u] * b[c + u];
  }
  for (; c < d; ++c) acc[0] += a[c] * b[c];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Exact softmax of one query row over keys [0, n), n > 0: p[j] = exp(s_j - m) / sum with
// s_j = scale * q.k_j and m = max_j s_j (subtracting the max first keeps exp from overflowing).
// Returns the row's LSE = m + ln(sum).
double softmax_row(const double* q, const double* k, int64_t n, int64_t d, double scale,
                   double* p) {
  double m = -kInf;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = scale * dot(q, k + j * d, d);
    if (!(p[j] <= m)) m = p[j];  // also takes a NaN, so that NaN input reaches the output
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    sum += p[j];
  }
  for (int64_t j = 0; j < n; ++j) p[j] /= sum;
  return m + std::log(sum);
}

// Splits parallel work item `item` of a [batch][head][block] grid into its coordinates.
struct GridItem {
  int64_t batch, head, block;
};
GridItem split_item(int64_t item, int64_t heads, int64_t blocks) {
  return {item / blocks / heads, (item / blocks) % heads, item % blocks};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status reference_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& opt, const TensorView& o,
                                   const TensorView& lse) {
  AttentionShape sh;
  FP4ATTN_RETURN_IF_ERROR(
      validate_attention(q, k, v, o, lse, {DType::kF64, DType::kF32, DType::kBF16, DType::kF16},
                         {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}, {}, &sh));
  double scale = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, sh.d, &scale));

  const int64_t d = sh.d;
  const int64_t group = sh.h_kv > 0 ? sh.h / sh.h_kv : 1;
  const int64_t blocks = ceil_div(sh.s_q, kBlock);
  parallel_for(sh.b * sh.h * blocks, [&](int64_t item) {
    const GridItem it = split_item(item, sh.h, blocks);
    const int64_t kv_head = it.head / group;
    const int64_t r0 = it.block * kBlock, r1 = std::min(sh.s_q, r0 + kBlock);
    const int64_t nk = visible_keys(sh, opt.causal, r1 - 1);  // the last row sees the most keys
    std::vector<double> qd, kd, vd, p(nk), out(d);
    gather_rows(q, it.batch, it.head, r0, r1, &qd);
    gather_rows(k, it.batch, kv_head, 0, nk, &kd);
    gather_rows(v, it.batch, kv_head, 0, nk, &vd);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t n = visible_keys(sh, opt.causal, i);
      std::fill(out.begin(), out.end(), 0.0);
      double row_lse = kInf;  // a row with no visible key: O = 0 and LSE = +inf
      if (n > 0) {
        row_lse = softmax_row(&qd[(i - r0) * d], kd.data(), n, d, scale, p.data());
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t c = 0; c < d; ++c) out[c] += p[j] * vd[j * d + c];
        }
      }
      scatter_row(o, it.batch, i, it.head, out.data());
      if (lse.defined()) store_from_double(lse, offset3(lse, it.batch, it.head, i), row_lse);
    }
  });
  return Status::Ok();
}

Status reference_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& dout, const AttentionOptions& opt,
                                    const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv) {
  AttentionShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_attention(
      q, k, v, dout, TensorView{}, {DType::kF64, DType::kF32, DType::kBF16, DType::kF16},
      {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}, {}, &sh, "dout"));
  FP4ATTN_RETURN_IF_ERROR(check_like(dq, "dq", q, "q", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_like(dk, "dk", k, "k", {DType::kF64, DType::kF32}));
  FP4ATTN_RETURN_IF_ERROR(check_like(dv, "dv", v, "v", {DType::kF64, DType::kF32}));
  double scale = 0;
  FP4ATTN_RETURN_IF_ERROR(resolve_softmax_scale(opt.softmax_scale, sh.d, &scale));

  const int64_t d = sh.d;
  const int64_t group = sh.h_kv > 0 ? sh.h / sh.h_kv : 1;  // h_kv == 0 only when h == 0
  // Per query row, saved by pass 1 for pass 2: its LSE and D = rowsum(dout * O).
  std::vector<double> row_lse(sh.b * sh.h * sh.s_q), row_d(sh.b * sh.h * sh.s_q);

  // Pass 1, per (batch, head, row block): P, O, D, dP = dout V^T, dS = P * (dP - D) and
  // dq = scale * dS K. Every dq row is written by exactly one work item.
  const int64_t row_blocks = ceil_div(sh.s_q, kBlock);
  parallel_for(sh.b * sh.h * row_blocks, [&](int64_t item) {
    const GridItem it = split_item(item, sh.h, row_blocks);
    const int64_t kv_head = it.head / group;
    const int64_t r0 = it.block * kBlock, r1 = std::min(sh.s_q, r0 + kBlock);
    const int64_t nk = visible_keys(sh, opt.causal, r1 - 1);
    std::vector<double> qd, dod, kd, vd, p(nk), o_row(d), grad(d);
    gather_rows(q, it.batch, it.head, r0, r1, &qd);
    gather_rows(dout, it.batch, it.head, r0, r1, &dod);
    gather_rows(k, it.batch, kv_head, 0, nk, &kd);
    gather_rows(v, it.batch, kv_head, 0, nk, &vd);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t n = visible_keys(sh, opt.causal, i);
      const int64_t row = (it.batch * sh.h + it.head) * sh.s_q + i;
      const double* q_i = &qd[(i - r0) * d];
      const double* do_i = &dod[(i - r0) * d];
      std::fill(grad.begin(), grad.end(), 0.0);
      row_lse[row] = kInf;  // no visible key: the row contributes nothing
      row_d[row] = 0;
      if (n > 0) {
        row_lse[row] = softmax_row(q_i, kd.data(), n, d, scale, p.data());
        std::fill(o_row.begin(), o_row.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t c = 0; c < d; ++c) o_row[c] += p[j] * vd[j * d + c];
        }
        row_d[row] = dot(do_i, o_row.data(), d);
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dot(do_i, &vd[j * d], d) - row_d[row]);
          for (int64_t c = 0; c < d; ++c) grad[c] += ds * kd[j * d + c];
        }
        for (int64_t c = 0; c < d; ++c) grad[c] *= scale;
      }
      scatter_row(dq, it.batch, i, it.head, grad.data());
    }
  });

  // Pass 2, per (batch, kv head, key block): dv_j = sum P_ij dout_i and dk_j = scale * sum dS_ij
  // q_i over the rows of every query head of the group. Each key's sums run in one fixed order
  // inside one work item: race-free and independent of the thread count.
  const int64_t key_blocks = ceil_div(sh.s_k, kBlock);
  parallel_for(sh.b * sh.h_kv * key_blocks, [&](int64_t item) {
    const GridItem it = split_item(item, sh.h_kv, key_blocks);
    const int64_t j0 = it.block * kBlock, j1 = std::min(sh.s_k, j0 + kBlock);
    // Causal: rows before i_min see none of these keys.
    const int64_t i_min = opt.causal ? std::clamp<int64_t>(j0 - (sh.s_k - sh.s_q), 0, sh.s_q) : 0;
    std::vector<double> kd, vd, qd, dod, acc_k((j1 - j0) * d, 0.0), acc_v((j1 - j0) * d, 0.0);
    gather_rows(k, it.batch, it.head, j0, j1, &kd);
    gather_rows(v, it.batch, it.head, j0, j1, &vd);
    for (int64_t head = it.head * group; head < (it.head + 1) * group; ++head) {
      gather_rows(q, it.batch, head, i_min, sh.s_q, &qd);
      gather_rows(dout, it.batch, head, i_min, sh.s_q, &dod);
      for (int64_t i = i_min; i < sh.s_q; ++i) {
        const int64_t row = (it.batch * sh.h + head) * sh.s_q + i;
        const double* q_i = &qd[(i - i_min) * d];
        const double* do_i = &dod[(i - i_min) * d];
        const int64_t j_end = std::min(j1, visible_keys(sh, opt.causal, i));
        for (int64_t j = j0; j < j_end; ++j) {
          const double* k_j = &kd[(j - j0) * d];
          const double* v_j = &vd[(j - j0) * d];
          const double p = std::exp(scale * dot(q_i, k_j, d) - row_lse[row]);
          const double ds = p * (dot(do_i, v_j, d) - row_d[row]);
          for (int64_t c = 0; c < d; ++c) {
            acc_v[(j - j0) * d + c] += p * do_i[c];
            acc_k[(j - j0) * d + c] += scale * ds * q_i[c];
          }
        }
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      scatter_row(dk, it.batch, j, it.head, &acc_k[(j - j0) * d]);
      scatter_row(dv, it.batch, j, it.head, &acc_v[(j - j0) * d]);
    }
  });
  return Status::Ok();
}

}  // namespace fp4attn
