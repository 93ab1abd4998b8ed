// The command line of fp4attn_bench's suites, on the flag parser every fp4attn program shares
// (tools/common/cli_args.h): the flags every suite takes (--out or --json, --revision, --device,
// --help) and the list flags several take.
#pragma once

#include <string>
#include <vector>

#include "cli_args.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/recipe.h"
#include "suites.h"

namespace fp4attn::bench {

using cli::Args;
using cli::FlagSpec;
using cli::UsageError;

// A suite's own flags followed by the common ones; default_out is the JSON written without --out.
std::vector<FlagSpec> suite_flags(std::vector<FlagSpec> own, const std::string& default_out);

// The common flags' values (the revision defaults to the configure-time one) and the command.
void read_suite_flags(const Args& a, const std::string& default_out, const std::string& command,
                      SuiteOptions* opt);

// Prints the suite's help when --help was given; true when it did (the suite returns 0 then).
bool print_help(const Args& a, const std::string& usage, const std::vector<FlagSpec>& flags);

// --recipes as recipe names, e.g. "fp8,nvfp4".
std::vector<Recipe> recipe_list(const Args& a, const std::string& fallback);

// --recipes of the paged suites: KV cache formats, "nvfp4" and "fp8".
std::vector<KvCacheFormat> cache_format_list(const Args& a, const std::string& fallback);

}  // namespace fp4attn::bench
