// What every JSON document of fp4attn's programs starts with (the head of DESIGN.md's record
// schema: suite, revision, device, date, command), and what fills it: the version and git
// revision this binary was built from, the CPU's model, the UTC time.
#pragma once

#include <ctime>
#include <string>

#include "json_writer.h"

namespace fp4attn::cli {

// python/fp4attn/_version.py's version ("0.1.0"), read at build time.
const char* build_version();
// The git revision of the source tree at build time: 12 hex digits, "-dirty" appended when
// tracked files differed from that commit, or "unknown" (tools/build_info.cmake says how).
const char* build_revision();

// The "model name" of a /proc/cpuinfo text (or the field that names the CPU where there is none,
// as on some Arm kernels), whitespace trimmed; "unknown" when no line names it.
std::string cpu_model_from_cpuinfo(const std::string& cpuinfo);
// "cpu: <model>" of this machine's /proc/cpuinfo ("cpu: unknown" where it cannot be read).
std::string cpu_device_name();

// t as UTC ISO 8601 to the second, e.g. 2026-11-30T10:36:39Z.
std::string utc_iso8601(std::time_t t);

// The head of a document: suite, revision, device, date (now), command, backend ("cpu", "gpu" or
// "gpu+cpu"), version; the caller appends its own keys.
JsonObject json_document_header(const std::string& suite, const std::string& device,
                                const std::string& command, const std::string& backend);

}  // namespace fp4attn::cli
