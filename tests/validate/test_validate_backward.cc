// Argument checks of the GPU backward (attention_bwd_cuda.h), on the host: every bad input gives a
// Status naming the argument, before anything reaches a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "validate/validate_backward.h"

namespace fp4attn {
namespace {

// Host buffers standing in for device memory: validation never dereferences them.
struct Problem {
  int64_t b = 2, h = 4, h_kv = 2, s_q = 100, s_k = 300, d = 128;
  std::vector<uint8_t> qd, kd, vd;
  std::vector<float> qs, ks, vs, lse, dq, dk, dv;
  std::vector<uint16_t> o, dout, q16, k16, v16;
  ForwardOperands in;
  ForwardOptions opt;
  TensorView to, tl, tdo, tdq, tdk, tdv, tq, tk, tv;
  Problem() {
    opt.recipe = Recipe::kNvfp4;
    build();
  }
  void build() {
    qd.assign(b * h * s_q * d + 64, 0);
    kd.assign(b * h_kv * s_k * d + 64, 0);
    vd.assign(b * h_kv * d * operand_v_pitch(s_k) + 64, 0);
    qs.assign(b * h * operand_scale_tiles(s_q), 1);
    ks.assign(b * h_kv * operand_scale_tiles(s_k), 1);
    vs.assign(b * h_kv * d, 1);
    o.assign(b * s_q * h * d + 8, 0);
    dout.assign(b * s_q * h * d + 8, 0);
    q16.assign(b * s_q * h * d + 8, 0);
    k16.assign(b * s_k * h_kv * d + 8, 0);
    v16.assign(b * s_k * h_kv * d + 8, 0);
    lse.assign(b * h * s_q, 0);
    dq.assign(b * s_q * h * d, 0);
    dk.assign(b * s_k * h_kv * d, 0);
    dv.assign(b * s_k * h_kv * d, 0);
    in.q_data = make_view(align(qd.data()), DType::kE4M3, {b, h, s_q, d});
    in.k_data = make_view(align(kd.data()), DType::kE4M3, {b, h_kv, s_k, d});
    in.v_data = make_view(align(vd.data()), DType::kE4M3, {b, h_kv, d, operand_v_pitch(s_k)});
    in.q_scale = make_view(qs.data(), DType::kF32, {b, h, operand_scale_tiles(s_q)});
    in.k_scale = make_view(ks.data(), DType::kF32, {b, h_kv, operand_scale_tiles(s_k)});
    in.v_scale = make_view(vs.data(), DType::kF32, {b, h_kv, d});
    to = make_view(o.data(), DType::kBF16, {b, s_q, h, d});
    tdo = make_view(dout.data(), DType::kBF16, {b, s_q, h, d});
    tq = make_view(q16.data(), DType::kBF16, {b, s_q, h, d});
    tk = make_view(k16.data(), DType::kBF16, {b, s_k, h_kv, d});
    tv = make_view(v16.data(), DType::kBF16, {b, s_k, h_kv, d});
    tl = make_view(lse.data(), DType::kF32, {b, h, s_q});
    tdq = make_view(dq.data(), DType::kF32, {b, s_q, h, d});
    tdk = make_view(dk.data(), DType::kF32, {b, s_k, h_kv, d});
    tdv = make_view(dv.data(), DType::kF32, {b, s_k, h_kv, d});
  }
  static void* align(uint8_t* p) {
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
  }
  Status check_operands() const {
    ForwardShape sh;
    return validate_backward_operands(in, opt, to, tl, tdo, tdq, tdk, tdv, &sh);
  }
  Status check_inputs() const {
    ForwardShape sh;
    return validate_backward_inputs(tq, tk, tv, opt, to, tl, tdo, tdq, tdk, tdv, &sh);
  }
};

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ValidateBackward, AcceptsWellFormedProblems) {
  Problem pb;
  ForwardShape sh;
  Status st =
      validate_backward_operands(pb.in, pb.opt, pb.to, pb.tl, pb.tdo, pb.tdq, pb.tdk, pb.tdv, &sh);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(sh.s_k, 300);
  EXPECT_EQ(sh.h_kv, 2);
  st = pb.check_inputs();
  ASSERT_TRUE(st.ok()) << st.message();
  // BF16 gradients and FP16 dO are accepted too.
  pb.tdq.dtype = pb.tdk.dtype = pb.tdv.dtype = DType::kBF16;
  pb.tdo.dtype = DType::kF16;
  EXPECT_TRUE(pb.check_operands().ok());
}

TEST(ValidateBackward, RecipesWithoutAGpuBackwardAreUnsupported) {
  for (Recipe r : kAllRecipes) {
    Problem pb;
    pb.opt.recipe = r;
    const Status st = pb.check_operands();
    const bool want = recipe_has_gpu_backward(r);  // the engine's recipes but int8, int8-fast
    EXPECT_EQ(st.ok(), want) << recipe_name(r) << ": " << st.message();
    if (!want) {
      EXPECT_TRUE(st.unsupported()) << recipe_name(r);
      EXPECT_NE(st.message().find("recipe"), std::string::npos);
    }
  }
}

// nvfp4-fast rebuilds its P codes from the forward's row_max: required, of lse's shape and dtype.
// Other recipes ignore it (checked when given).
TEST(ValidateBackward, RowMaxForTheCodes) {
  Problem pb;
  ForwardShape sh;
  ASSERT_TRUE(
      validate_backward_operands(pb.in, pb.opt, pb.to, pb.tl, pb.tdo, pb.tdq, pb.tdk, pb.tdv, &sh)
          .ok());
  EXPECT_TRUE(validate_backward_row_max(pb.opt, TensorView{}, sh).ok()) << "nvfp4: unused";
  expect_error(validate_backward_row_max(pb.opt, pb.tdq, sh), "row_max: expected rank 3");
  pb.opt.recipe = Recipe::kNvfp4Fast;
  expect_error(validate_backward_row_max(pb.opt, TensorView{}, sh),
               "row_max: required for 'nvfp4-fast'");
  EXPECT_TRUE(validate_backward_row_max(pb.opt, pb.tl, sh).ok());
  std::vector<float> small(pb.b * pb.h * (pb.s_q - 1));
  expect_error(validate_backward_row_max(
                   pb.opt, make_view(small.data(), DType::kF32, {pb.b, pb.h, pb.s_q - 1}), sh),
               "row_max: expected shape (2, 4, 100)");
  expect_error(validate_backward_row_max(
                   pb.opt, make_view(pb.o.data(), DType::kBF16, {pb.b, pb.h, pb.s_q}), sh),
               "row_max");
}

TEST(ValidateBackward, LseIsRequired) {
  Problem pb;
  pb.tl = TensorView{};
  expect_error(pb.check_operands(), "lse: required");
  expect_error(pb.check_inputs(), "lse: required");
}

TEST(ValidateBackward, RejectsBadDout) {
  {
    Problem pb;
    pb.tdo.dtype = DType::kF32;
    expect_error(pb.check_operands(), "dout");
  }
  {
    Problem pb;
    pb.tdo = make_view(pb.dout.data(), DType::kBF16, {pb.b, pb.s_q + 1, pb.h, pb.d});
    expect_error(pb.check_operands(), "dout: expected shape");
  }
  {
    Problem pb;
    pb.tdo.data = nullptr;
    expect_error(pb.check_inputs(), "dout: data pointer is null");
  }
  {
    Problem pb;
    pb.tdo.stride[3] = 2;
    expect_error(pb.check_operands(), "dout: the last dimension must be contiguous");
  }
  {
    Problem pb;
    pb.tdo = make_view(pb.dout.data(), DType::kBF16, {pb.b, pb.s_q, pb.h * pb.d});
    expect_error(pb.check_operands(), "dout: expected rank 4");
  }
}

TEST(ValidateBackward, RejectsBadGradients) {
  {
    Problem pb;
    pb.tdq.dtype = DType::kF16;
    expect_error(pb.check_operands(), "dq");
  }
  {
    Problem pb;
    pb.tdk = make_view(pb.dk.data(), DType::kF32, {pb.b, pb.s_k, pb.h, pb.d});  // h, not h_kv
    expect_error(pb.check_operands(), "dk: expected shape");
  }
  {
    Problem pb;
    pb.tdv.stride[1] = 0;  // every key written to one place
    expect_error(pb.check_operands(), "dv: stride 0");
  }
  {
    Problem pb;
    pb.tdv.data = nullptr;
    expect_error(pb.check_inputs(), "dv: data pointer is null");
  }
  {
    Problem pb;
    pb.tdq = make_view(pb.dq.data(), DType::kF32, {pb.b, pb.s_q, pb.h, 64});
    expect_error(pb.check_inputs(), "dq: expected shape");
  }
}

TEST(ValidateBackward, ForwardChecksStillApply) {
  {
    Problem pb;
    pb.opt.softmax_scale = -1.f;
    expect_error(pb.check_operands(), "softmax_scale");
  }
  {
    Problem pb;
    pb.tl = make_view(pb.lse.data(), DType::kF32, {pb.b, pb.h, pb.s_q - 1});
    expect_error(pb.check_operands(), "lse: expected shape");
  }
  {
    Problem pb;
    pb.in.q_scale = make_view(pb.qs.data(), DType::kF32, {pb.b, pb.h, 7});
    expect_error(pb.check_operands(), "q_scale");
  }
  {
    Problem pb;
    pb.to.dtype = DType::kF32;
    expect_error(pb.check_operands(), "o");
  }
  {
    Problem pb;
    pb.tk = make_view(pb.k16.data(), DType::kBF16, {pb.b, pb.s_k, 3, pb.d});
    pb.tv = make_view(pb.v16.data(), DType::kBF16, {pb.b, pb.s_k, 3, pb.d});
    expect_error(pb.check_inputs(), "must divide");
  }
}

// d_source: a known value, deterministic or not.
TEST(ValidateBackward, DSourceOptions) {
  BackwardCudaOptions bopt;
  EXPECT_TRUE(validate_backward_options(bopt).ok());
  bopt.d_source = static_cast<DSource>(7);
  expect_error(validate_backward_options(bopt), "d_source: unknown");
  bopt.d_source = DSource::kHighPrecisionO;
  for (bool det : {false, true}) {
    bopt.deterministic = det;
    EXPECT_TRUE(validate_backward_options(bopt).ok());
  }
}

}  // namespace
}  // namespace fp4attn
