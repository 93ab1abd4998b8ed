// Every public attention entry point rejects bad input with a message that names the argument
// (the checks are shared, this test makes sure each entry point actually runs them).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/golden/reference.h"

namespace fp4attn {
namespace {

struct Buffers {
  std::vector<float> q, k, v, o, lse, dq, dk, dv;
  Buffers() : q(4096), k(4096), v(4096), o(4096), lse(4096), dq(4096), dk(4096), dv(4096) {}
};

// Views of a valid problem b=1, s_q=8, s_k=8, h=2, h_kv=2, d=64, which each case then breaks.
struct Args {
  TensorView q, k, v, o, lse;
};

Args valid(Buffers& m) {
  return {make_view(m.q.data(), DType::kF32, {1, 8, 2, 64}),
          make_view(m.k.data(), DType::kF32, {1, 8, 2, 64}),
          make_view(m.v.data(), DType::kF32, {1, 8, 2, 64}),
          make_view(m.o.data(), DType::kF32, {1, 8, 2, 64}),
          make_view(m.lse.data(), DType::kF32, {1, 2, 8})};
}

struct BadCase {
  const char* name;
  std::function<void(Args&, Buffers&)> breaks;
  const char* expected;  // substring of the error message
};

std::vector<BadCase> bad_cases() {
  return {
      {"wrong rank",
       [](Args& a, Buffers& m) {
         a.q = make_view(m.q.data(), DType::kF32, {8, 2, 64});
       },
       "q: expected rank 4"},
      {"mismatched batch",
       [](Args& a, Buffers& m) {
         a.k = make_view(m.k.data(), DType::kF32, {2, 8, 2, 64});
         a.v = make_view(m.v.data(), DType::kF32, {2, 8, 2, 64});
       },
       "k: expected shape"},
      {"heads not a multiple",
       [](Args& a, Buffers& m) {
         a.q = make_view(m.q.data(), DType::kF32, {1, 8, 3, 64});
         a.o = make_view(m.o.data(), DType::kF32, {1, 8, 3, 64});
         a.lse = make_view(m.lse.data(), DType::kF32, {1, 3, 8});
       },
       "not a multiple of kv heads 2"},
      {"k/v shape",
       [](Args& a, Buffers& m) {
         a.v = make_view(m.v.data(), DType::kF32, {1, 7, 2, 64});
       },
       "v: expected shape"},
      {"bad last stride",
       [](Args& a, Buffers& m) {
         a.k = make_strided_view(m.k.data(), DType::kF32, {1, 8, 2, 64}, {2048, 256, 128, 2});
       },
       "k: the last dimension must be contiguous"},
      {"o shape",
       [](Args& a, Buffers& m) {
         a.o = make_view(m.o.data(), DType::kF32, {1, 8, 2, 32});
       },
       "o: expected shape"},
      {"lse shape",
       [](Args& a, Buffers& m) {
         a.lse = make_view(m.lse.data(), DType::kF32, {1, 8, 2});
       },
       "lse: expected shape"},
      {"dtype",
       [](Args& a, Buffers& m) {
         a.q = make_view(m.q.data(), DType::kU8, {1, 8, 2, 64});
       },
       "q: expected dtype"},
  };
}

using EntryPoint = std::function<Status(const Args&, Buffers&)>;

std::vector<std::pair<const char*, EntryPoint>> entry_points() {
  return {
      {"reference_attention_forward",
       [](const Args& a, Buffers&) {
         return reference_attention_forward(a.q, a.k, a.v, {}, a.o, a.lse);
       }},
      {"reference_attention_backward",
       [](const Args& a, Buffers& m) {
         // dout takes the place of o; backward has no lse argument.
         Status st = reference_attention_backward(
             a.q, a.k, a.v, a.o, {}, make_view(m.dq.data(), DType::kF32, {1, 8, 2, 64}),
             make_view(m.dk.data(), DType::kF32, {1, 8, 2, 64}),
             make_view(m.dv.data(), DType::kF32, {1, 8, 2, 64}));
         if (!st.ok()) {  // backward names o "dout"
           std::string msg = st.message();
           if (msg.rfind("dout:", 0) == 0) msg = "o:" + msg.substr(5);
           return Status::Invalid(msg);
         }
         return st;
       }},
      {"golden_attention_forward",
       [](const Args& a, Buffers&) {
         return golden_attention_forward(a.q, a.k, a.v, RecipeOptions{}, a.o, a.lse);
       }},
  };
}

TEST(EntryPoints, AcceptTheValidProblem) {
  for (auto& [name, call] : entry_points()) {
    Buffers m;
    Args a = valid(m);
    Status st = call(a, m);
    EXPECT_TRUE(st.ok()) << name << ": " << st.message();
  }
}

TEST(EntryPoints, RejectBadInputNamingTheArgument) {
  for (auto& [name, call] : entry_points()) {
    for (const BadCase& c : bad_cases()) {
      if (std::string(name) == "reference_attention_backward" && std::string(c.name) == "lse shape")
        continue;  // backward takes no lse
      Buffers m;
      Args a = valid(m);
      c.breaks(a, m);
      Status st = call(a, m);
      ASSERT_FALSE(st.ok()) << name << " accepted: " << c.name;
      EXPECT_NE(st.message().find(c.expected), std::string::npos)
          << name << " / " << c.name << ": " << st.message();
    }
  }
}

TEST(EntryPoints, UnsupportedHeadDimOnlyForTheRecipes) {
  Buffers m;
  Args a = valid(m);
  a.q = make_view(m.q.data(), DType::kF32, {1, 8, 2, 48});
  a.k = make_view(m.k.data(), DType::kF32, {1, 8, 2, 48});
  a.v = make_view(m.v.data(), DType::kF32, {1, 8, 2, 48});
  a.o = make_view(m.o.data(), DType::kF32, {1, 8, 2, 48});
  // The float64 reference takes any head_dim; the recipes take 64 and 128.
  EXPECT_TRUE(reference_attention_forward(a.q, a.k, a.v, {}, a.o, a.lse).ok());
  Status st = golden_attention_forward(a.q, a.k, a.v, RecipeOptions{}, a.o, a.lse);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("head_dim 48 is not supported (supported: 64, 128)"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace fp4attn
