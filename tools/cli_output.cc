#include "cli_output.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "gpu/run_gpu.h"

namespace fp4attn::cli {

FlagSpec json_flag() {
  return {"json", true,
          "also write the results as JSON to this file, with the revision, device, backend, "
          "command and date of the run",
          ""};
}

FlagSpec quiet_flag() { return {"quiet", false, "no [i/N] progress lines on stderr", ""}; }

JsonObject cli_document(const std::string& suite, const std::string& command,
                        const std::vector<std::string>& argv, RanOn ran) {
  std::vector<std::string> words = {"fp4attn", command};
  words.insert(words.end(), argv.begin(), argv.end());
  std::string device, backend;
  if (ran.gpu) {
    device = gpu_device_name();
    if (device.empty()) device = "unknown CUDA device";
    backend = "gpu";
  }
  if (ran.cpu || !ran.gpu) {  // a document of no computation (fp4attn recipes) ran on the CPU
    device += (device.empty() ? "" : "; ") + cpu_device_name();
    backend += backend.empty() ? "cpu" : "+cpu";
  }
  return json_document_header(suite, device, command_line(words), backend);
}

void check_json_path(const Args& a) {
  if (!a.has("json")) return;
  const std::string path = a.get("json", "");
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::ofstream f(path, std::ios::app);  // append: an existing file keeps its text until the end
  if (!f) throw UsageError("--json: cannot write '" + path + "'");
  f.close();
  if (!existed) std::filesystem::remove(path, ec);
}

void write_cli_json(const Args& a, const JsonObject& doc) {
  const std::string path = a.get("json", "");
  if (!write_json_file(path, doc)) throw UsageError("--json: cannot write '" + path + "'");
}

Progress cli_progress(const Args& a, int64_t total) { return Progress(total, a.has("quiet")); }

}  // namespace fp4attn::cli
