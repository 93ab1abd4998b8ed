// The JSON writer of every fp4attn command-line program (the CLI's --json, fp4attn_bench's suite
// files; DESIGN.md "Testing and measuring"): values are rendered to text as they are added,
// objects keep their keys in order, NaN and Inf (not JSON) become null.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fp4attn::cli {

// "text" with quotes, backslashes and control characters escaped.
std::string json_string(const std::string& s);

// A number with `digits` significant digits; null when not finite.
std::string json_number(double v, int digits = 6);

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
  JsonObject& obj(const std::string& key, const JsonObject& v) { return raw(key, v.render()); }

  // One line: {"a": 1, "b": "x"}
  std::string render() const;
  // One key per line (the top level of a file), with a final newline.
  std::string render_multiline() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// [a, b, c] on one line.
std::string json_array(const std::vector<std::string>& rendered);

// [a, b, c] with one element per line, indented under a multi-line object.
std::string json_array_lines(const std::vector<std::string>& rendered);

// Writes `doc.render_multiline()` to `path`; false when the file cannot be written.
bool write_json_file(const std::string& path, const JsonObject& doc);

}  // namespace fp4attn::cli
