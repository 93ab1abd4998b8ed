#include "record.h"

#include <cstdio>

namespace fp4attn::bench {

JsonObject record_header(const std::string& suite, bool part, const SuiteOptions& opt,
                         const std::string& device, const std::string& date) {
  JsonObject o;
  o.str("suite", suite);
  if (part) o.str("part", "fp4attn_bench");
  return o.str("revision", opt.revision)
      .str("device", device)
      .str("date", date)
      .str("command", opt.command);
}

JsonObject clocks_json(const Clocks& c) {
  JsonObject o;
  if (!c.ok) return o.boolean("ok", false);
  return o.num("sm_mhz", c.sm_mhz, 5)
      .num("max_sm_mhz", c.max_sm_mhz, 5)
      .num("power_w", c.power_w, 5)
      .num("temp_c", c.temp_c, 3);
}

bool write_record(const SuiteOptions& opt, const JsonObject& doc) {
  if (cli::write_json_file(opt.out_path, doc)) return true;
  std::fprintf(stderr, "fp4attn_bench: cannot write %s\n", opt.out_path.c_str());
  return false;
}

}  // namespace fp4attn::bench
