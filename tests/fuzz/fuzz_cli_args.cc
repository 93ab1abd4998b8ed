// libFuzzer target: the flag parser of every fp4attn command-line program (tools/common/
// cli_args.h). Input: [lo: 8][hi: 8] then argv words separated by NUL bytes (cli_args.dict
// holds the flag names). Invariants, a trap (or an escaping exception) when broken:
//  * Args() and every getter either succeed or throw UsageError: no other exception, no crash;
//  * a flag reported present was written on the command line; integers and doubles lie in the
//    requested [lo, hi] (doubles finite); list items are non-empty and join back to the value;
//    integer lists have one in-range integer per item;
//  * command_line() quotes words so that a POSIX shell splits the line back into them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cli_args.h"
#include "fuzz/fuzz_check.h"

namespace fp4attn::cli {
namespace {

// Value flags and switches as the CLI and the benchmarks declare them.
const std::vector<FlagSpec> kSpecs = {
    {"batch", true, "batch size", "1"},
    {"heads", true, "query heads", "4"},
    {"seqlen-q", true, "query length", ""},
    {"ms", true, "milliseconds", "2.5"},
    {"recipes", true, "recipe list", "fp8,nvfp4"},
    {"dims", true, "head dims", "64,128"},
    {"out", true, "JSON path", ""},
    {"quick", false, "short run", ""},
    {"help", false, "this text", ""},
};

// A flag named on the command line: --name, --name=..., or -h for help.
bool written(const std::vector<std::string>& argv, const std::string& name) {
  for (const std::string& w : argv) {
    if (w == "--" + name || w.rfind("--" + name + "=", 0) == 0) return true;
    if (name == "help" && w == "-h") return true;
  }
  return false;
}

// POSIX shell word splitting restricted to what command_line() emits: spaces between words,
// '...' quoting, and \' outside quotes. A missing closing quote is a failure.
bool shell_split(const std::string& line, std::vector<std::string>* out) {
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ') {
      if (in_word) out->push_back(word);
      word.clear();
      in_word = false;
    } else if (c == '\'') {
      const size_t close = line.find('\'', i + 1);
      if (close == std::string::npos) return false;
      word += line.substr(i + 1, close - i - 1);
      i = close;
      in_word = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i];
      in_word = true;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) out->push_back(word);
  return true;
}

int64_t read_i64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  int64_t s;
  std::memcpy(&s, &v, 8);
  return s;
}

void check_parsed(const Args& a, const std::vector<std::string>& argv, int64_t lo, int64_t hi) {
  for (const FlagSpec& s : kSpecs) {
    FUZZ_CHECK(!a.has(s.name) || written(argv, s.name));
    if (!s.takes_value) continue;
    try {
      const int64_t v = a.get_int(s.name, lo, lo, hi);
      FUZZ_CHECK(a.has(s.name) ? v >= lo && v <= hi : v == lo);  // absent: the fallback
    } catch (const UsageError&) {
    }
    try {
      const double v = a.get_double(s.name, 0.0, static_cast<double>(lo), static_cast<double>(hi));
      FUZZ_CHECK(std::isfinite(v));
      FUZZ_CHECK(!a.has(s.name) || (v >= static_cast<double>(lo) && v <= static_cast<double>(hi)));
    } catch (const UsageError&) {
    }
    try {
      const std::vector<std::string> items = a.get_list(s.name, "a,b");
      std::string joined;
      for (const std::string& item : items) {
        FUZZ_CHECK(!item.empty());
        joined += (joined.empty() ? "" : ",") + item;
      }
      FUZZ_CHECK(joined == a.get(s.name, "a,b"));
      try {
        const std::vector<int64_t> ints = a.get_int_list(s.name, "1,2", lo, hi);
        FUZZ_CHECK(ints.size() == a.get_list(s.name, "1,2").size());
        for (int64_t v : ints) FUZZ_CHECK(v >= lo && v <= hi);
      } catch (const UsageError&) {
      }
    } catch (const UsageError&) {
    }
  }
}

}  // namespace
}  // namespace fp4attn::cli

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fp4attn::cli;
  if (size < 16 || size > 4096) return 0;
  const int64_t lo = read_i64(data), hi = read_i64(data + 8);
  std::vector<std::string> argv;
  std::string word;
  for (size_t i = 16; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(data[i]);
    }
  }
  argv.push_back(word);

  try {
    const Args a(argv, kSpecs);
    check_parsed(a, argv, lo, hi);
  } catch (const UsageError&) {
    // Bad usage is reported, never anything else: another exception escapes and libFuzzer
    // reports it.
  }
  std::vector<std::string> back;
  FUZZ_CHECK(shell_split(command_line(argv), &back));
  // An empty word is quoted ('') and comes back; the splitter sees each word once.
  FUZZ_CHECK(back == argv);
  (void)format_help("usage: fuzz [flags]", kSpecs);
  return 0;
}
