// "[i/N] <case>" lines of a long run, on stderr so that stdout holds only the results; silent
// under --quiet.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace fp4attn::cli {

class Progress {
 public:
  // total: the cases the run will go through; quiet: print nothing.
  Progress(int64_t total, bool quiet, std::FILE* out = stderr)
      : total_(total), quiet_(quiet), out_(out) {}

  // Announces the next case ("[3/8] input gaussian, recipe nvfp4") before it runs.
  void next(const std::string& what);

 private:
  int64_t done_ = 0, total_;
  bool quiet_;
  std::FILE* out_;
};

}  // namespace fp4attn::cli
