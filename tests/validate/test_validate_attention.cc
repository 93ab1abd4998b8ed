// validate_attention / resolve_softmax_scale: every rejection names the argument and says what
// was expected; the tests match message substrings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "validate/validate_attention.h"

namespace fp4attn {
namespace {

// gtest-only substring check (the test binary does not link gmock).
::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// Valid views over one dummy buffer (validation never reads the data). b=2, s_q=5, s_k=7, h=6,
// h_kv=2, d=8.
class ValidateAttention : public ::testing::Test {
 protected:
  std::vector<float> buf = std::vector<float>(4096);
  TensorView q = make_view(buf.data(), DType::kF32, {2, 5, 6, 8});
  TensorView k = make_view(buf.data(), DType::kF32, {2, 7, 2, 8});
  TensorView v = make_view(buf.data(), DType::kF32, {2, 7, 2, 8});
  TensorView o = make_view(buf.data(), DType::kF32, {2, 5, 6, 8});
  TensorView lse = make_view(buf.data(), DType::kF32, {2, 6, 5});
  AttentionShape shape{};

  Status run(std::initializer_list<int> allowed_d = {}) {
    return validate_attention(q, k, v, o, lse, {DType::kBF16, DType::kF32}, {DType::kF32},
                              allowed_d, &shape);
  }
  // Asserts that validation fails with a message containing every one of `parts`.
  void expect_error(std::initializer_list<const char*> parts,
                    std::initializer_list<int> allowed_d = {}) {
    Status st = run(allowed_d);
    ASSERT_FALSE(st.ok());
    for (const char* p : parts) EXPECT_TRUE(HasSubstr(st.message(), p));
  }
};

TEST_F(ValidateAttention, AcceptsValidInputsAndFillsShape) {
  ASSERT_TRUE(run().ok()) << run().message();
  EXPECT_EQ(shape.b, 2);
  EXPECT_EQ(shape.s_q, 5);
  EXPECT_EQ(shape.s_k, 7);
  EXPECT_EQ(shape.h, 6);
  EXPECT_EQ(shape.h_kv, 2);
  EXPECT_EQ(shape.d, 8);
  lse = TensorView{};  // lse is optional
  EXPECT_TRUE(run().ok());
  EXPECT_TRUE(run({8, 64}).ok());
}

TEST_F(ValidateAttention, WrongRank) {
  q = make_view(buf.data(), DType::kF32, {5, 6, 8});
  expect_error({"q: expected rank 4", "got rank 3"});
}

TEST_F(ValidateAttention, LseWrongRank) {
  lse = make_view(buf.data(), DType::kF32, {2, 6, 5, 1});
  expect_error({"lse: expected rank 3", "got rank 4"});
}

TEST_F(ValidateAttention, NegativeSize) {
  k.shape[1] = -1;
  expect_error({"k: negative size"});
}

TEST_F(ValidateAttention, MismatchedBatch) {
  k = make_view(buf.data(), DType::kF32, {3, 7, 2, 8});
  v = k;
  expect_error({"k: expected shape (b=2, s_k, h_kv, d=8) like q", "got (3, 7, 2, 8)"});
}

TEST_F(ValidateAttention, MismatchedHeadDim) {
  k = make_view(buf.data(), DType::kF32, {2, 7, 2, 4});
  v = k;
  expect_error({"k: expected shape (b=2, s_k, h_kv, d=8) like q", "got (2, 7, 2, 4)"});
}

TEST_F(ValidateAttention, KvShapeMismatch) {
  v = make_view(buf.data(), DType::kF32, {2, 6, 2, 8});
  expect_error({"v: expected shape (2, 7, 2, 8) like k", "got (2, 6, 2, 8)"});
}

TEST_F(ValidateAttention, HeadsNotMultipleOfKvHeads) {
  k = make_view(buf.data(), DType::kF32, {2, 7, 4, 8});
  v = k;
  expect_error({"q/k: number of heads 6 is not a multiple of kv heads 4"});
}

TEST_F(ValidateAttention, ZeroKvHeads) {
  k = make_view(buf.data(), DType::kF32, {2, 7, 0, 8});
  v = k;
  expect_error({"k: number of kv heads is 0", "6 heads"});
}

TEST_F(ValidateAttention, UnsupportedHeadDim) {
  expect_error({"q: head_dim 8 is not supported (supported: 64, 128)"}, {64, 128});
  q = make_view(buf.data(), DType::kF32, {0, 5, 6, 513});
  k = make_view(buf.data(), DType::kF32, {0, 7, 2, 513});
  v = k;
  o = q;
  expect_error({"q: head_dim 513 is not supported (supported: 1..512)"});
  q.shape[3] = k.shape[3] = v.shape[3] = o.shape[3] = 0;
  expect_error({"q: head_dim 0 is not supported"});
}

TEST_F(ValidateAttention, BadDtype) {
  k.dtype = DType::kF16;
  expect_error({"k: expected dtype bfloat16, float32, got float16"});
  k.dtype = DType::kF32;
  o.dtype = DType::kBF16;
  expect_error({"o: expected dtype float32, got bfloat16"});
  o.dtype = DType::kF32;
  lse.dtype = DType::kBF16;
  expect_error({"lse: expected dtype float32, float64, got bfloat16"});
}

TEST_F(ValidateAttention, LastDimStrideNotOne) {
  v.stride[3] = 2;
  expect_error({"v: the last dimension must be contiguous (stride 1), got stride 2"});
}

TEST_F(ValidateAttention, NegativeStride) {
  q.stride[1] = -48;
  expect_error({"q: negative stride in dimension 1"});
}

TEST_F(ValidateAttention, OverlappingOutputs) {
  o.stride[1] = 0;
  expect_error({"o: stride 0 in dimension 1 (size 5) would make output elements overlap"});
  o = q;
  lse.stride[1] = 0;
  expect_error({"lse: stride 0 in dimension 1 (size 6)"});
  // Broadcast inputs are fine, and so is stride 0 on a dimension of size 1.
  lse = make_view(buf.data(), DType::kF32, {2, 6, 5});
  k.stride[1] = 0;
  v.stride[0] = 0;
  o = make_strided_view(buf.data(), DType::kF32, {2, 5, 6, 8}, {240, 48, 8, 1});
  EXPECT_TRUE(run().ok()) << run().message();
  q = o = make_strided_view(buf.data(), DType::kF32, {2, 1, 6, 8}, {48, 0, 8, 1});
  lse = make_view(buf.data(), DType::kF32, {2, 6, 1});
  EXPECT_TRUE(run().ok()) << run().message();
}

TEST_F(ValidateAttention, NullDataForNonEmptyTensor) {
  o.data = nullptr;
  expect_error({"o: data pointer is null"});
}

TEST_F(ValidateAttention, NullDataAllowedForEmptyTensor) {
  q = make_view(nullptr, DType::kF32, {2, 0, 6, 8});
  o = q;
  lse = make_view(nullptr, DType::kF32, {2, 6, 0});
  EXPECT_TRUE(run().ok()) << run().message();
  EXPECT_EQ(shape.s_q, 0);
}

TEST_F(ValidateAttention, ZeroSizesAccepted) {
  for (int dim : {0, 1, 2}) {  // b, s_q, h zero
    TensorView q0 = make_view(buf.data(), DType::kF32, {2, 5, 6, 8});
    q0.shape[dim] = 0;
    q = o = q0;
    k = make_view(buf.data(), DType::kF32, {q0.shape[0], 7, dim == 2 ? 0 : 2, 8});
    v = k;
    lse = make_view(buf.data(), DType::kF32, {q0.shape[0], q0.shape[2], q0.shape[1]});
    EXPECT_TRUE(run().ok()) << "dim " << dim << ": " << run().message();
  }
  // s_k == 0 is not an error either.
  q = o = make_view(buf.data(), DType::kF32, {2, 5, 6, 8});
  k = v = make_view(buf.data(), DType::kF32, {2, 0, 2, 8});
  lse = make_view(buf.data(), DType::kF32, {2, 6, 5});
  EXPECT_TRUE(run().ok()) << run().message();
}

TEST_F(ValidateAttention, LseWrongShape) {
  lse = make_view(buf.data(), DType::kF32, {2, 5, 6});
  expect_error({"lse: expected shape (b, h, s_q) = (2, 6, 5), got (2, 5, 6)"});
}

TEST_F(ValidateAttention, OWrongShape) {
  o = make_view(buf.data(), DType::kF32, {2, 5, 3, 8});
  expect_error({"o: expected shape (2, 5, 6, 8) like q, got (2, 5, 3, 8)"});
}

TEST_F(ValidateAttention, CustomOutputNameTreatsItAsInput) {
  o.stride[1] = 0;  // a broadcast dout is fine
  EXPECT_TRUE(
      validate_attention(q, k, v, o, lse, {DType::kF32}, {DType::kF32}, {}, &shape, "dout").ok());
  o = make_view(buf.data(), DType::kF32, {2, 5, 3, 8});
  Status st = validate_attention(q, k, v, o, lse, {DType::kF32}, {DType::kF32}, {}, &shape, "dout");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "dout: expected shape (2, 5, 6, 8) like q"));
}

TEST(CheckLike, NamesBothTensors) {
  std::vector<float> buf(512);
  TensorView q = make_view(buf.data(), DType::kF32, {1, 4, 2, 8});
  TensorView dq = make_view(buf.data(), DType::kF32, {1, 4, 2, 4});
  Status st = check_like(dq, "dq", q, "q", {DType::kF32});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "dq: expected shape (1, 4, 2, 8) like q, got (1, 4, 2, 4)"));
  dq = make_view(buf.data(), DType::kBF16, {1, 4, 2, 8});
  st = check_like(dq, "dq", q, "q", {DType::kF64, DType::kF32});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "dq: expected dtype float64, float32, got bfloat16"));
  dq.dtype = DType::kF32;
  EXPECT_TRUE(check_like(dq, "dq", q, "q", {DType::kF32}).ok());
  dq.stride[0] = 0;  // size 1: fine
  EXPECT_TRUE(check_like(dq, "dq", q, "q", {DType::kF32}).ok());
  dq.stride[2] = 0;
  st = check_like(dq, "dq", q, "q", {DType::kF32});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "dq: stride 0 in dimension 2 (size 2)"));
}

TEST(ResolveSoftmaxScale, ZeroMeansInverseSqrtHeadDim) {
  double s = 0;
  ASSERT_TRUE(resolve_softmax_scale(0, 64, &s).ok());
  EXPECT_EQ(s, 0.125);
  ASSERT_TRUE(resolve_softmax_scale(0.3, 64, &s).ok());
  EXPECT_EQ(s, 0.3);
}

TEST(ResolveSoftmaxScale, RejectsNegativeNanAndInf) {
  double s = 0;
  Status st = resolve_softmax_scale(-1, 64, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "softmax_scale: expected a finite value > 0, got -1");
  st = resolve_softmax_scale(std::nan(""), 64, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "softmax_scale: expected a finite value > 0, got nan"));
  st = resolve_softmax_scale(std::numeric_limits<double>::infinity(), 64, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "softmax_scale: expected a finite value > 0, got inf"));
  st = resolve_softmax_scale(-std::numeric_limits<double>::infinity(), 64, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(HasSubstr(st.message(), "got -inf"));
}

}  // namespace
}  // namespace fp4attn
