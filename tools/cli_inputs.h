// Flags shared by the CLI's subcommands: --input (the standard suite's input kinds,
// fp4attn/suite.h) and --recipe (a recipe name), each also 'all'; the shape flags of the suite
// commands (grad, emulation).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cli_args.h"
#include "core/checked_size.h"
#include "fp4attn/recipe.h"
#include "harness/suite.h"

namespace fp4attn::cli {

// The kinds named by --input (default gaussian); throws UsageError naming the flag otherwise.
std::vector<InputKind> parse_input_kinds(const Args& a);

// The recipes named by --recipe (default all); throws UsageError naming the flag otherwise.
std::vector<Recipe> parse_recipes(const Args& a);

// The problem of `fp4attn grad` and `fp4attn emulation`: --batch, --heads (query and key/value),
// --seqlen (query and key), --head-dim (64 or 128), --causal, and their --seed (each command
// declares it with its own help).
struct SuiteShape {
  int64_t b, h, s, d;
  bool causal;
  uint64_t seed;
};
// Throws UsageError naming the flag on a bad value.
SuiteShape parse_suite_shape(const Args& a);

// The product of flag values, e.g. {{"--batch", b}, {"--seqlen-q", s}, ...}; throws UsageError
// naming the flags when it overflows int64 (core/checked_size.h).
int64_t flag_product(const char* what, std::initializer_list<SizeFactor> flags);

// One host buffer of a command: `count` elements of `bytes` bytes each.
struct HostBuffer {
  int64_t count, bytes;
};
// Throws UsageError, starting with `flags` (the flags that set the sizes), when the buffers'
// total overflows int64 or exceeds host_memory_limit(): refused before anything is allocated.
void check_host_buffers(const std::string& flags, std::initializer_list<HostBuffer> buffers);

// The shape flags above followed by a command's own flags (a function, not a global table: the
// commands' tables are themselves built during static initialization).
std::vector<FlagSpec> with_suite_shape_flags(std::vector<FlagSpec> own);

}  // namespace fp4attn::cli
