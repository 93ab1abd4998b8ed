// A few helpers to write the benchmark JSON (DESIGN.md "Testing and measuring") by hand: values
// are rendered to text as they are added, objects keep their keys in order.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace fp4attn::bench {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Numbers with `digits` significant digits; NaN and Inf (not JSON) become null.
inline std::string json_number(double v, int digits = 6) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

class JsonObject {
 public:
  JsonObject& raw(const std::string& key, std::string rendered) {
    items_.emplace_back(key, std::move(rendered));
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& v) { return raw(key, json_string(v)); }
  JsonObject& num(const std::string& key, double v, int digits = 6) {
    return raw(key, json_number(v, digits));
  }
  JsonObject& integer(const std::string& key, long long v) { return raw(key, std::to_string(v)); }
  JsonObject& boolean(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  JsonObject& null(const std::string& key) { return raw(key, "null"); }

  // One line: {"a": 1, "b": "x"}
  std::string render() const {
    std::string out = "{";
    for (size_t i = 0; i < items_.size(); ++i) {
      if (i) out += ", ";
      out += json_string(items_[i].first) + ": " + items_[i].second;
    }
    return out + "}";
  }
  // One key per line (the top level of a suite file).
  std::string render_multiline() const {
    std::string out = "{\n";
    for (size_t i = 0; i < items_.size(); ++i) {
      out += "  " + json_string(items_[i].first) + ": " + items_[i].second;
      out += i + 1 < items_.size() ? ",\n" : "\n";
    }
    return out + "}\n";
  }

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// [a, b, c] with one element per line, indented under a multi-line object.
inline std::string json_array_lines(const std::vector<std::string>& rendered) {
  if (rendered.empty()) return "[]";
  std::string out = "[\n";
  for (size_t i = 0; i < rendered.size(); ++i) {
    out += "    " + rendered[i];
    out += i + 1 < rendered.size() ? ",\n" : "\n";
  }
  return out + "  ]";
}

}  // namespace fp4attn::bench
