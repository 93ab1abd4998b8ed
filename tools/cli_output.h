// What the CLI's commands write besides their tables: the --json document, whose head
// (revision, device, backend, command, date...) has its one home here, and the [i/N] progress
// lines on stderr that --quiet silences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "build_info.h"
#include "cli_args.h"
#include "json_writer.h"
#include "progress.h"

namespace fp4attn::cli {

// The --json and --quiet flags of a command, with their help.
FlagSpec json_flag();
FlagSpec quiet_flag();

// The backends that produced a document's results.
struct RanOn {
  bool cpu = false, gpu = false;
};

// The head of every JSON document of the CLI (build_info.h's json_document_header): `suite`,
// the revision and version of this binary, the device (the GPU's name when results came from
// the GPU, else "cpu: <model>"; both, ";"-separated, when from both), the backend ("cpu", "gpu"
// or "gpu+cpu"), the command line (`fp4attn <command> <argv>`, quoted as a shell takes it) and
// the UTC date.
JsonObject cli_document(const std::string& suite, const std::string& command,
                        const std::vector<std::string>& argv, RanOn ran);

// Throws UsageError naming --json when its file cannot be opened for writing: called before the
// work, so that a long run does not end in that error. Leaves no file behind.
void check_json_path(const Args& a);

// Writes doc to the path of --json; throws UsageError naming --json when it cannot.
void write_cli_json(const Args& a, const JsonObject& doc);

// Progress over `total` cases, silent under --quiet.
Progress cli_progress(const Args& a, int64_t total);

}  // namespace fp4attn::cli
