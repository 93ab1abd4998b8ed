// The flag parser of every fp4attn command-line program (the fp4attn CLI, fp4attn_bench,
// fp4attn_race_probe): --name value / --name=value / --switch, -h for --help, with errors that
// name the flag. Bad usage throws UsageError; the programs print it on one line and exit with 2.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4attn::cli {

// Thrown for bad usage; main() prints "<program> <cmd>: <message>" and exits with 2.
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
  // A finite number in [lo, hi].
  double get_double(const std::string& name, double fallback, double lo = -1e308,
                    double hi = 1e308) const;
  // A comma-separated list ("fp8,nvfp4"); fallback is parsed the same way. Empty items are bad.
  std::vector<std::string> get_list(const std::string& name, const std::string& fallback) const;
  // A comma-separated list of integers, each in [lo, hi].
  std::vector<int64_t> get_int_list(const std::string& name, const std::string& fallback,
                                    int64_t lo, int64_t hi) const;

 private:
  std::map<std::string, std::string> values_;
};

std::string format_help(const std::string& usage, const std::vector<FlagSpec>& specs);

// The words of a command line joined as a shell would take them back (quoted where needed): the
// `command` recorded in a JSON file.
std::string command_line(const std::vector<std::string>& words);

}  // namespace fp4attn::cli
