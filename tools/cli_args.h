// A small flag parser for the fp4attn CLI: --name value / --name=value / --switch, with errors
// that name the flag. Bad usage exits with code 2 and a one-line message.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4attn::cli {

// Thrown for bad usage; main() prints "fp4attn <cmd>: <message>" and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct FlagSpec {
  std::string name;  // without the leading dashes
  bool takes_value;
  std::string help;
  std::string default_value;  // shown in --help
};

class Args {
 public:
  // Parses argv against `specs`; throws UsageError for unknown flags or missing values.
  Args(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  // Integer in [lo, hi]; UsageError "--heads: expected an integer in [1, 4096], got 'x'".
  int64_t get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  double get_double(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

std::string format_help(const std::string& usage, const std::vector<FlagSpec>& specs);

}  // namespace fp4attn::cli
