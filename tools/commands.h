// The fp4attn CLI's subcommands; each returns the process exit code and throws UsageError for
// bad usage.
#pragma once

#include <string>
#include <vector>

namespace fp4attn::cli {

int cmd_run(const std::vector<std::string>& argv);
int cmd_decode(const std::vector<std::string>& argv);
int cmd_recipes(const std::vector<std::string>& argv);
int cmd_emulation(const std::vector<std::string>& argv);
int cmd_grad(const std::vector<std::string>& argv);

}  // namespace fp4attn::cli
