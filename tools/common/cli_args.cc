#include "cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace fp4attn::cli {

Args::Args(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string a = argv[i] == "-h" ? std::string("--help") : argv[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "' (see --help)");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (!spec) throw UsageError("unknown flag --" + name + " (see --help)");
    if (spec->takes_value && !inline_value) {
      if (i + 1 >= argv.size()) throw UsageError("--" + name + ": expected a value");
      value = argv[++i];
    } else if (!spec->takes_value && inline_value) {
      throw UsageError("--" + name + ": takes no value");
    }
    values_[name] = value;
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    std::ostringstream m;
    m << "--" << name << ": expected an integer in [" << lo << ", " << hi << "], got '" << s << "'";
    throw UsageError(m.str());
  }
  return v;
}

double Args::get_double(const std::string& name, double fallback, double lo, double hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& s = it->second;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) {
    throw UsageError("--" + name + ": expected a finite number, got '" + s + "'");
  }
  if (v < lo || v > hi) {
    std::ostringstream m;
    m << "--" << name << ": expected a number in [" << lo << ", " << hi << "], got '" << s << "'";
    throw UsageError(m.str());
  }
  return v;
}

std::vector<std::string> Args::get_list(const std::string& name,
                                        const std::string& fallback) const {
  const std::string text = get(name, fallback);
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (items.back().empty()) {
      throw UsageError("--" + name + ": expected a comma-separated list, got '" + text + "'");
    }
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

std::vector<int64_t> Args::get_int_list(const std::string& name, const std::string& fallback,
                                        int64_t lo, int64_t hi) const {
  std::vector<int64_t> out;
  for (const std::string& item : get_list(name, fallback)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < lo || v > hi) {
      std::ostringstream m;
      m << "--" << name << ": expected comma-separated integers in [" << lo << ", " << hi
        << "], got '" << get(name, fallback) << "'";
      throw UsageError(m.str());
    }
    out.push_back(v);
  }
  return out;
}

std::string format_help(const std::string& usage, const std::vector<FlagSpec>& specs) {
  std::ostringstream s;
  s << usage << "\n\nFlags:\n";
  for (const FlagSpec& f : specs) {
    std::string left = "  --" + f.name + (f.takes_value ? " <value>" : "");
    s << left << std::string(left.size() < 28 ? 28 - left.size() : 1, ' ') << f.help;
    if (!f.default_value.empty()) s << " (default: " << f.default_value << ")";
    s << "\n";
  }
  return s.str();
}

std::string command_line(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += ' ';
    if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789-_./=,:+@%") == std::string::npos) {
      out += w;
      continue;
    }
    out += '\'';  // single quotes; a quote inside becomes '\''
    for (const char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

}  // namespace fp4attn::cli
