#include "json_writer.h"

#include <cmath>
#include <cstdio>
#include <fstream>

namespace fp4attn::cli {

std::string json_string(const std::string& s) {
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

std::string json_number(double v, int digits) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string JsonObject::render() const {
  std::string out = "{";
  for (size_t i = 0; i < items_.size(); ++i) {
    if (i) out += ", ";
    out += json_string(items_[i].first) + ": " + items_[i].second;
  }
  return out + "}";
}

std::string JsonObject::render_multiline() const {
  std::string out = "{\n";
  for (size_t i = 0; i < items_.size(); ++i) {
    out += "  " + json_string(items_[i].first) + ": " + items_[i].second;
    out += i + 1 < items_.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

std::string json_array(const std::vector<std::string>& rendered) {
  std::string out = "[";
  for (size_t i = 0; i < rendered.size(); ++i) {
    if (i) out += ", ";
    out += rendered[i];
  }
  return out + "]";
}

std::string json_array_lines(const std::vector<std::string>& rendered) {
  if (rendered.empty()) return "[]";
  std::string out = "[\n";
  for (size_t i = 0; i < rendered.size(); ++i) {
    out += "    " + rendered[i];
    out += i + 1 < rendered.size() ? ",\n" : "\n";
  }
  return out + "  ]";
}

bool write_json_file(const std::string& path, const JsonObject& doc) {
  std::ofstream f(path);
  f << doc.render_multiline();
  f.close();
  return static_cast<bool>(f);
}

}  // namespace fp4attn::cli
