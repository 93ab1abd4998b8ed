// Status: how every public entry point reports bad input. Never throws across the API.
#pragma once

#include <string>
#include <utility>

namespace fp4attn {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  // The message names the argument and says what was expected, e.g.
  // "q: expected rank 4 (batch, seqlen, heads, head_dim), got rank 3".
  static Status Invalid(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

// Returns from the enclosing function when `expr` is an error Status.
#define FP4ATTN_RETURN_IF_ERROR(expr) \
  do {                                \
    ::fp4attn::Status _st = (expr);   \
    if (!_st.ok()) return _st;        \
  } while (0)

}  // namespace fp4attn
