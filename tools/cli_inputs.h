// The --input flag shared by the CLI's subcommands: one of the standard suite's input kinds
// (fp4attn/suite.h) or 'all'.
#pragma once

#include <vector>

#include "cli_args.h"
#include "fp4attn/suite.h"

namespace fp4attn::cli {

// The kinds named by --input (default gaussian); throws UsageError naming the flag otherwise.
std::vector<InputKind> parse_input_kinds(const Args& a);

}  // namespace fp4attn::cli
