#include "build_info.h"

#include <fstream>
#include <sstream>

namespace fp4attn::cli {
namespace {

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// The first non-empty value of `key` in a /proc/cpuinfo text; empty when none.
std::string cpuinfo_field(const std::string& cpuinfo, const std::string& key) {
  std::istringstream lines(cpuinfo);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || trimmed(line.substr(0, colon)) != key) continue;
    const std::string value = trimmed(line.substr(colon + 1));
    if (!value.empty()) return value;
  }
  return "";
}

}  // namespace

std::string cpu_model_from_cpuinfo(const std::string& cpuinfo) {
  // x86 says "model name"; Arm kernels may say only "Hardware" or "Processor"; POWER says "cpu".
  for (const char* key : {"model name", "Hardware", "Processor", "cpu model", "cpu"}) {
    if (std::string v = cpuinfo_field(cpuinfo, key); !v.empty()) return v;
  }
  // Arm64 kernels name no model, only its codes (e.g. 0x41 0xd4f: Arm's Neoverse V2).
  const std::string implementer = cpuinfo_field(cpuinfo, "CPU implementer");
  const std::string part = cpuinfo_field(cpuinfo, "CPU part");
  if (!implementer.empty() && !part.empty()) {
    return "arm implementer " + implementer + " part " + part;
  }
  return "unknown";
}

std::string cpu_device_name() {
  std::ifstream f("/proc/cpuinfo");
  std::ostringstream text;
  text << f.rdbuf();
  return "cpu: " + cpu_model_from_cpuinfo(text.str());
}

std::string utc_iso8601(std::time_t t) {
  std::tm utc{};
  if (!gmtime_r(&t, &utc)) return "unknown";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

JsonObject json_document_header(const std::string& suite, const std::string& device,
                                const std::string& command, const std::string& backend) {
  JsonObject doc;
  doc.str("suite", suite).str("revision", build_revision()).str("device", device);
  doc.str("date", utc_iso8601(std::time(nullptr))).str("command", command);
  return doc.str("backend", backend).str("version", build_version());
}

}  // namespace fp4attn::cli
