// Flags shared by the CLI's subcommands: --input (the standard suite's input kinds,
// fp4attn/suite.h) and --recipe (a recipe name), each also 'all'.
#pragma once

#include <vector>

#include "cli_args.h"
#include "fp4attn/recipe.h"
#include "fp4attn/suite.h"

namespace fp4attn::cli {

// The kinds named by --input (default gaussian); throws UsageError naming the flag otherwise.
std::vector<InputKind> parse_input_kinds(const Args& a);

// The recipes named by --recipe (default all); throws UsageError naming the flag otherwise.
std::vector<Recipe> parse_recipes(const Args& a);

}  // namespace fp4attn::cli
