// TensorView's shape arithmetic at the edges (issue 26): empty tensors are contiguous whatever
// their strides, and shapes whose size overflows int64 are refused, not wrapped.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/checked_size.h"
#include "fp4attn/tensor.h"

namespace fp4attn {
namespace {

TEST(TensorView, EmptyIsContiguousWhateverItsStrides) {
  // torch's strides of torch.empty(1, 2, 0, 64) and of the V operand (1, 2, 64, 0).
  const TensorView k = make_strided_view(nullptr, DType::kF32, {1, 2, 0, 64}, {128, 64, 64, 1});
  const TensorView v = make_strided_view(nullptr, DType::kU8, {1, 2, 64, 0}, {128, 64, 1, 1});
  EXPECT_EQ(k.numel(), 0);
  EXPECT_TRUE(k.is_contiguous());
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_TRUE(check_contiguous_shape(k, "k", {1, 2, 0, 64}, DType::kF32).ok());
  EXPECT_TRUE(check_contiguous_shape(v, "v", {1, 2, 64, 0}, DType::kU8).ok());
  // A non-empty tensor with such strides is still not contiguous.
  const TensorView t = make_strided_view(nullptr, DType::kF32, {1, 2, 3, 64}, {128, 64, 64, 1});
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorView, EmptyWhateverTheOtherSizes) {
  const TensorView t = make_view(nullptr, DType::kF32, {int64_t(1) << 40, int64_t(1) << 40, 0, 1});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(check_rank(t, "x", 4, "(b, s, h, d)").ok());
}

TEST(TensorView, ShapeOverflowingInt64IsRefusedNamingTheArgument) {
  // 2^64 elements: the product wrapped to 0, so the tensor passed as empty.
  const TensorView q = make_view(nullptr, DType::kF32, {1 << 20, 1 << 25, 1 << 12, 1 << 7});
  const Status st = check_rank(q, "q", 4, "(batch, seqlen, heads, head_dim)");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "q: shape (1048576, 33554432, 4096, 128) has more bytes than int64 can count");
  // 2^62 elements of 4 bytes: the elements fit, the bytes do not.
  const TensorView x = make_view(nullptr, DType::kF32, {int64_t(1) << 31, int64_t(1) << 31});
  EXPECT_FALSE(check_rank(x, "x", 2, "(rows, cols)").ok());
  const TensorView ok = make_view(nullptr, DType::kU8, {int64_t(1) << 31, int64_t(1) << 31});
  EXPECT_TRUE(check_rank(ok, "x", 2, "(rows, cols)").ok());
}

TEST(CheckedSize, ProductsNameTheirFactors) {
  int64_t n = -1;
  EXPECT_TRUE(checked_product("q elements", {{"b", 2}, {"s", 3}, {"h", 4}}, &n).ok());
  EXPECT_EQ(n, 24);
  const Status st = checked_product(
      "q elements", {{"--batch", 1 << 20}, {"--seqlen-q", 1 << 25}, {"--heads", 4096}}, &n);
  EXPECT_TRUE(st.ok());
  const Status big = checked_product(
      "q elements",
      {{"--batch", 1 << 20}, {"--seqlen-q", 1 << 25}, {"--heads", 4096}, {"--head-dim", 128}}, &n);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.message(),
            "q elements: --batch * --seqlen-q * --heads * --head-dim = 1048576 * 33554432 * 4096 * "
            "128 overflows int64");
  const Status neg = checked_product("rows", {{"b", 2}, {"s", -1}}, &n);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.message().find("has a negative factor"), std::string::npos);
  int64_t r = 0;
  EXPECT_FALSE(checked_mul(INT64_MAX, 2, &r));
  EXPECT_FALSE(checked_add(INT64_MAX, 1, &r));
  EXPECT_TRUE(checked_add(INT64_MAX - 1, 1, &r));
  EXPECT_EQ(r, INT64_MAX);
}

TEST(CheckedSize, HostBytesAboveTheLimitAreRefused) {
  setenv("FP4ATTN_HOST_MEMORY_LIMIT", "1048576", 1);
  EXPECT_EQ(host_memory_limit(), 1048576);
  EXPECT_TRUE(check_host_bytes("x", 1048576).ok());
  const Status st = check_host_bytes("--batch, --heads", 3 << 20);
  unsetenv("FP4ATTN_HOST_MEMORY_LIMIT");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("--batch, --heads: the host buffers need 3.00 MiB, more than the "
                               "1.00 MiB of host memory allowed",
                               0),
            0u)
      << st.message();
  EXPECT_GT(host_memory_limit(), int64_t(1) << 20);  // the machine's memory
}

}  // namespace
}  // namespace fp4attn
