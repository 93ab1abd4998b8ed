// How a suite writes its JSON, through the JSON writer every fp4attn program shares
// (tools/common/json_writer.h): the head of DESIGN.md's schema (bench/record.py writes the same
// one for the Python harnesses), the clocks, the file.
#pragma once

#include <string>

#include "json_writer.h"
#include "suites.h"
#include "timing.h"

namespace fp4attn::bench {

using cli::json_array;
using cli::json_array_lines;
using cli::JsonObject;

// suite, part ("fp4attn_bench" when the file is one part of a record that a bench/*.py merge
// completes), revision, device, date, command.
JsonObject record_header(const std::string& suite, bool part, const SuiteOptions& opt,
                         const std::string& device, const std::string& date);

// nvidia-smi's readings, {"ok": false} when there were none.
JsonObject clocks_json(const Clocks& c);

// Writes doc to opt.out_path; false, with a message, when the file cannot be written.
bool write_record(const SuiteOptions& opt, const JsonObject& doc);

}  // namespace fp4attn::bench
