// Status: how every public entry point reports bad input. Never throws across the API.
#pragma once

#include <string>
#include <utility>

namespace fp4attn {

class Status {
 public:
  enum class Code { kOk, kInvalid, kUnsupported };

  Status() = default;
  static Status Ok() { return Status(); }
  // The message names the argument and says what was expected, e.g.
  // "q: expected rank 4 (batch, seqlen, heads, head_dim), got rank 3".
  static Status Invalid(std::string message) { return Status(Code::kInvalid, std::move(message)); }
  // A valid request this build or device cannot run (yet), e.g. a recipe the GPU engine lacks:
  // callers can fall back (to the CPU golden model, another recipe) instead of fixing input.
  static Status Unsupported(std::string message) {
    return Status(Code::kUnsupported, std::move(message));
  }

  bool ok() const { return code_ == Code::kOk; }
  bool unsupported() const { return code_ == Code::kUnsupported; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Returns from the enclosing function when `expr` is an error Status.
#define FP4ATTN_RETURN_IF_ERROR(expr) \
  do {                                \
    ::fp4attn::Status _st = (expr);   \
    if (!_st.ok()) return _st;        \
  } while (0)

}  // namespace fp4attn
