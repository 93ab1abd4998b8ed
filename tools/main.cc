// fp4attn: command-line front end (run, decode, recipes, emulation, grad).
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "build_info.h"
#include "cli_args.h"
#include "cli_output.h"
#include "commands.h"
#include "fp4attn/recipe.h"

namespace fp4attn::cli {

int cmd_recipes(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {json_flag(), {"help", false, "show this help", ""}};
  const Args a(argv, flags);
  if (a.has("help")) {
    std::printf("%s",
                format_help("usage: fp4attn recipes [flags]\n\nLists the numerics recipes.", flags)
                    .c_str());
    return 0;
  }
  std::vector<std::string> records;
  for (Recipe r : kAllRecipes) {
    std::printf("%-11s %s\n", recipe_name(r), recipe_summary(r));
    records.push_back(
        JsonObject().str("recipe", recipe_name(r)).str("summary", recipe_summary(r)).render());
  }
  if (a.has("json")) {
    JsonObject doc = cli_document("recipes", "recipes", argv, RanOn{});
    write_cli_json(a, doc.raw("records", json_array_lines(records)));
  }
  return 0;
}

}  // namespace fp4attn::cli

namespace {

constexpr const char* kUsage =
    "usage: fp4attn <command> [flags]\n"
    "       fp4attn --version\n\n"
    "Commands:\n"
    "  run       attention on seeded inputs; accuracy against float64 and time\n"
    "  decode    decode over a paged NVFP4/FP8 KV cache; accuracy and time\n"
    "  recipes   list the numerics recipes\n"
    "  emulation Hopper (folded) vs Blackwell (block-scaled) arithmetic of the golden model\n"
    "  grad      the backward's dQ, dK, dV per recipe and suite input against float64\n\n"
    "fp4attn <command> --help shows a command's flags. Every command takes --json FILE: the\n"
    "results as JSON, headed by the revision and version of this binary, the device, the\n"
    "backend (cpu, gpu or gpu+cpu), the command line and the UTC date. Commands that loop over\n"
    "cases (run, decode, emulation, grad) print [i/N] <case> progress lines on stderr (stdout\n"
    "holds the results only); --quiet silences them.\n\n"
    "fp4attn --version prints the version and the git revision this binary was built from.\n";

// The version, the revision ("-dirty": tracked files differed from that commit) and the
// backends of this binary.
void print_version() {
#ifdef FP4ATTN_CLI_HAS_CUDA
  const char* backends = "cpu golden model and CUDA kernels";
#else
  const char* backends = "cpu golden model only (built without CUDA)";
#endif
  std::printf("fp4attn %s (revision %s; %s)\n", fp4attn::cli::build_version(),
              fp4attn::cli::build_revision(), backends);
}

// One line on stderr, whatever the message holds.
int fail(const std::string& cmd, std::string message) {
  for (char& c : message) c = c == '\n' ? ' ' : c;
  std::fprintf(stderr, "fp4attn %s: %s\n", cmd.c_str(), message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fp4attn::cli;
  if (argc < 2) {
    std::fprintf(
        stderr,
        "fp4attn: missing command (run, decode, recipes, emulation, grad); see fp4attn --help\n");
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::printf("%s", kUsage);
    return 0;
  }
  if (cmd == "--version") {
    if (!rest.empty()) return fail(cmd, "takes no arguments");
    print_version();
    return 0;
  }
  try {
    if (cmd == "run") return cmd_run(rest);
    if (cmd == "decode") return cmd_decode(rest);
    if (cmd == "recipes") return cmd_recipes(rest);
    if (cmd == "emulation") return cmd_emulation(rest);
    if (cmd == "grad") return cmd_grad(rest);
    std::fprintf(stderr,
                 "fp4attn: unknown command '%s' (run, decode, recipes, emulation, grad); see "
                 "fp4attn --help\n",
                 cmd.c_str());
    return 2;
  } catch (const UsageError& e) {
    return fail(cmd, e.what());
  } catch (const std::bad_alloc&) {
    // Sizes are checked up front (host_memory_limit); this is memory the machine refused anyway.
    return fail(cmd, "out of host memory (std::bad_alloc); try smaller sizes");
  } catch (const std::exception& e) {
    // Never an abort: an internal error still ends with one line and exit code 2.
    return fail(cmd, std::string("error: ") + e.what());
  } catch (...) {
    return fail(cmd, "error: unknown exception");
  }
}
