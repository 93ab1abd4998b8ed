// Argument checks of the forward entry points, on the host: every bad input
// gives a Status that names the argument (nothing reaches a GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "validate/validate_forward.h"

namespace fp4attn {
namespace {

// Host buffers standing in for device memory: validation never dereferences
// them.
struct Operands {
  int64_t b = 2, h = 4, h_kv = 2, s_q = 100, s_k = 300, d = 128;
  std::vector<uint8_t> qd, kd, vd;
  std::vector<float> qs, ks, vs;
  std::vector<uint16_t> o;
  std::vector<float> lse;
  ForwardOperands in;
  TensorView to, tl;
  Operands() { build(); }
  void build() {
    qd.assign(b * h * s_q * d + 64, 0);
    kd.assign(b * h_kv * s_k * d + 64, 0);
    vd.assign(b * h_kv * d * operand_v_pitch(s_k) + 64, 0);
    qs.assign(b * h * operand_scale_tiles(s_q), 1);
    ks.assign(b * h_kv * operand_scale_tiles(s_k), 1);
    vs.assign(b * h_kv * d, 1);
    o.assign(b * s_q * h * d + 8, 0);
    lse.assign(b * h * s_q, 0);
    in.q_data = make_view(align(qd.data()), DType::kE4M3, {b, h, s_q, d});
    in.k_data = make_view(align(kd.data()), DType::kE4M3, {b, h_kv, s_k, d});
    in.v_data = make_view(align(vd.data()), DType::kE4M3, {b, h_kv, d, operand_v_pitch(s_k)});
    in.q_scale = make_view(qs.data(), DType::kF32, {b, h, operand_scale_tiles(s_q)});
    in.k_scale = make_view(ks.data(), DType::kF32, {b, h_kv, operand_scale_tiles(s_k)});
    in.v_scale = make_view(vs.data(), DType::kF32, {b, h_kv, d});
    to = make_view(o.data(), DType::kBF16, {b, s_q, h, d});
    tl = make_view(lse.data(), DType::kF32, {b, h, s_q});
  }
  static void* align(uint8_t* p) {
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
  }
  Status check(ForwardOptions opt = {}) const {
    ForwardShape sh;
    return validate_forward_operands(in, opt, to, tl, &sh);
  }
};

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ValidateForward, AcceptsAWellFormedProblem) {
  Operands ops;
  ForwardShape sh;
  const Status st = validate_forward_operands(ops.in, {}, ops.to, ops.tl, &sh);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(sh.h_kv, 2);
  EXPECT_EQ(sh.s_k, 300);
}

TEST(ValidateForward, RejectsBadOperands) {
  {
    Operands ops;
    ops.d = 96;
    ops.build();
    expect_error(ops.check(), "head_dim 96");
  }
  {
    Operands ops;
    ops.h_kv = 3;
    ops.build();
    expect_error(ops.check(), "must divide");
  }
  {
    Operands ops;
    ops.in.k_data.shape[0] = 1;
    expect_error(ops.check(), "k_data: batch");
  }
  {
    Operands ops;
    ops.in.q_data.dtype = DType::kBF16;
    expect_error(ops.check(), "q_data");
  }
  {
    Operands ops;
    ops.in.k_data.data = static_cast<uint8_t*>(ops.in.k_data.data) + 1;
    expect_error(ops.check(), "k_data: expected a 16-byte aligned");
  }
  {
    Operands ops;
    ops.in.v_data.shape[3] = ops.s_k;  // unpadded V^T
    expect_error(ops.check(), "v_data");
  }
  {
    Operands ops;
    ops.in.v_scale = TensorView{};
    expect_error(ops.check(), "v_scale");
  }
  {
    Operands ops;
    ops.tl.shape[2] = 5;
    expect_error(ops.check(), "lse");
  }
  {
    Operands ops;
    ops.to.dtype = DType::kF32;
    expect_error(ops.check(), "o");
  }
  {
    Operands ops;
    ops.to.data = reinterpret_cast<uint8_t*>(ops.o.data()) + 2;
    expect_error(ops.check(), "o: expected a 4-byte aligned");
  }
}

TEST(ValidateForward, RejectsBadOptions) {
  Operands ops;
  ForwardOptions opt;
  opt.recipe = Recipe::kBf16;
  expect_error(ops.check(opt), "recipe");
  EXPECT_TRUE(ops.check(opt).unsupported()) << "a recipe the engine lacks is not a user error";
  opt = {};
  opt.softmax_scale = -1;
  expect_error(ops.check(opt), "softmax_scale");
  EXPECT_FALSE(ops.check(opt).unsupported());
  opt.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(ops.check(opt), "softmax_scale");
}

TEST(ValidateForward, RejectsBadBshdInputs) {
  const int64_t b = 1, s = 10, h = 4, d = 64;
  std::vector<uint16_t> buf(b * s * h * d * 2);
  const TensorView q = make_view(buf.data(), DType::kBF16, {b, s, h, d});
  const TensorView o = make_view(buf.data(), DType::kBF16, {b, s, h, d});
  ForwardShape sh;
  ASSERT_TRUE(validate_forward_inputs(q, q, q, {}, o, {}, &sh).ok());
  const TensorView k16 = make_view(buf.data(), DType::kF16, {b, s, h, d});
  expect_error(validate_forward_inputs(q, k16, q, {}, o, {}, &sh), "k: dtype");
  const TensorView k3 = make_view(buf.data(), DType::kBF16, {b, s, 3, d});
  expect_error(validate_forward_inputs(q, k3, k3, {}, o, {}, &sh), "must divide");
  const TensorView v2 = make_view(buf.data(), DType::kBF16, {2, s, h, d});
  expect_error(validate_forward_inputs(q, q, v2, {}, o, {}, &sh), "v: batch");
  const TensorView f32 = make_view(buf.data(), DType::kF32, {b, s, h, d});
  expect_error(validate_forward_inputs(f32, q, q, {}, o, {}, &sh), "q");
  const TensorView strided = make_strided_view(buf.data(), DType::kBF16, {b, s, h, d},
                                               {s * h * d * 2, h * d * 2, d * 2, 2});
  expect_error(validate_forward_inputs(strided, q, q, {}, o, {}, &sh), "q");
}

TEST(ValidateForward, RejectsBadVarlenInputs) {
  const int64_t total = 40, h = 4, d = 64;
  std::vector<uint16_t> buf(total * h * d);
  const TensorView t = make_view(buf.data(), DType::kBF16, {total, h, d});
  std::vector<float> lse(h * total);
  const TensorView l = make_view(lse.data(), DType::kF32, {h, total});
  const int32_t good[3] = {0, 10, 40};
  EXPECT_TRUE(validate_forward_varlen(t, t, t, good, good, 2, {}, t, l).ok());
  const int32_t not_zero[3] = {1, 10, 40};
  expect_error(validate_forward_varlen(t, t, t, not_zero, good, 2, {}, t, l),
               "cu_seqlens_q: must start at 0");
  const int32_t decreasing[3] = {0, 30, 20};
  expect_error(validate_forward_varlen(t, t, t, good, decreasing, 2, {}, t, l),
               "cu_seqlens_k: offsets must not decrease");
  const int32_t too_long[3] = {0, 10, 41};
  expect_error(validate_forward_varlen(t, t, t, too_long, good, 2, {}, t, l), "exceeds");
  expect_error(validate_forward_varlen(t, t, t, nullptr, good, 2, {}, t, l), "cu_seqlens_q");
  const TensorView l_bad = make_view(lse.data(), DType::kF32, {total, h});
  expect_error(validate_forward_varlen(t, t, t, good, good, 2, {}, t, l_bad), "lse");
  const TensorView rank4 = make_view(buf.data(), DType::kBF16, {1, total, h, d});
  expect_error(validate_forward_varlen(rank4, t, t, good, good, 2, {}, t, l), "q");
}

}  // namespace
}  // namespace fp4attn
