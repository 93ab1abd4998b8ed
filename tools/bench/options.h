// Command-line helper shared by the benchmark suites: both "--opt value" and "--opt=value".
#pragma once

#include <string>

namespace fp4attn::bench {

// Splits "--key=value" into key and value (true); any other argument is the key itself (false).
inline bool split_option(const std::string& arg, std::string* key, std::string* value) {
  const size_t eq = arg.find('=');
  if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    *key = arg.substr(0, eq);
    *value = arg.substr(eq + 1);
    return true;
  }
  *key = arg;
  value->clear();
  return false;
}

}  // namespace fp4attn::bench
