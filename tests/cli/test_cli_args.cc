// The flag parser and the JSON writer that the CLI and the measuring programs share
// (tools/common): what fp4attn_bench's suites rely on beyond what the CLI checks exercise.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cli_args.h"
#include "json_writer.h"

namespace fp4attn::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"recipes", true, "", ""}, {"dims", true, "", ""},  {"ms", true, "", ""},
    {"quick", false, "", ""},  {"help", false, "", ""},
};

std::string usage_error(
    const std::vector<std::string>& argv, void (*use)(const Args&) = [](const Args&) {}) {
  try {
    use(Args(argv, kFlags));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CliArgs, ValuesSwitchesAndDashH) {
  const Args a({"--recipes", "fp8,nvfp4", "--quick", "--ms=2.5", "-h"}, kFlags);
  EXPECT_TRUE(a.has("quick"));
  EXPECT_TRUE(a.has("help"));
  EXPECT_EQ(a.get_list("recipes", "x"), (std::vector<std::string>{"fp8", "nvfp4"}));
  EXPECT_EQ(a.get_list("dims", "64,128"), (std::vector<std::string>{"64", "128"}));
  EXPECT_EQ(a.get_double("ms", 0, 0, 10), 2.5);
}

TEST(CliArgs, IntegerLists) {
  const Args a({"--dims", "64,128"}, kFlags);
  EXPECT_EQ(a.get_int_list("dims", "", 1, 4096), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(Args({}, kFlags).get_int_list("dims", "1024,2048", 1, 1 << 20),
            (std::vector<int64_t>{1024, 2048}));
}

TEST(CliArgs, ErrorsNameTheFlag) {
  EXPECT_EQ(usage_error({"--bogus"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(usage_error({"--recipes"}), "--recipes: expected a value");
  EXPECT_EQ(usage_error({"--quick=1"}), "--quick: takes no value");
  EXPECT_EQ(usage_error({"--dims", "64,x"},
                        [](const Args& a) { (void)a.get_int_list("dims", "", 1, 4096); }),
            "--dims: expected comma-separated integers in [1, 4096], got '64,x'");
  EXPECT_EQ(usage_error({"--recipes", "fp8,,nvfp4"},
                        [](const Args& a) { (void)a.get_list("recipes", ""); }),
            "--recipes: expected a comma-separated list, got 'fp8,,nvfp4'");
  EXPECT_EQ(usage_error({"--ms", "-1"}, [](const Args& a) { (void)a.get_double("ms", 0, 0, 10); }),
            "--ms: expected a number in [0, 10], got '-1'");
}

TEST(CliArgs, CommandLineQuotesWhatAShellWouldSplit) {
  EXPECT_EQ(command_line({"fp4attn_bench", "fwd", "--out", "a b.json", "--recipes=fp8,nvfp4"}),
            "fp4attn_bench fwd --out 'a b.json' --recipes=fp8,nvfp4");
  EXPECT_EQ(command_line({"x", "it's", ""}), "x 'it'\\''s' ''");
}

TEST(JsonWriter, EscapesOrdersAndNullsNonFinite) {
  JsonObject o;
  o.str("s", "a\"b\\c\n").num("x", 0.1234567891, 4).num("nan", std::nan("")).integer("i", -3);
  o.boolean("t", true).obj("o", JsonObject().null("n")).raw("a", json_array({"1", "2"}));
  EXPECT_EQ(o.render(),
            "{\"s\": \"a\\\"b\\\\c\\u000a\", \"x\": 0.1235, \"nan\": null, \"i\": -3, \"t\": true, "
            "\"o\": {\"n\": null}, \"a\": [1, 2]}");
  EXPECT_EQ(JsonObject().integer("a", 1).render_multiline(), "{\n  \"a\": 1\n}\n");
  EXPECT_EQ(json_array_lines({}), "[]");
  EXPECT_EQ(json_array_lines({"1", "2"}), "[\n    1,\n    2\n  ]");
}

}  // namespace
}  // namespace fp4attn::cli
