// The flag parser, the JSON writer, the documents' head and the progress lines that the CLI and
// the measuring programs share (tools/common): what fp4attn_bench's suites rely on beyond what
// the CLI checks exercise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <regex>
#include <string>
#include <vector>

#include "build_info.h"
#include "cli_args.h"
#include "json_writer.h"
#include "progress.h"

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

// Which revision and version: cli_checks.cmake compares them with git and _version.py.
TEST(CliBuildInfo, RevisionAndVersionAreSafeInJsonAndC) {
  const std::regex safe("[A-Za-z0-9._+-]+");
  EXPECT_TRUE(std::regex_match(build_revision(), safe)) << build_revision();
  EXPECT_TRUE(std::regex_match(build_version(), safe)) << build_version();
}

TEST(CliBuildInfo, CpuModelFromCpuinfo) {
  EXPECT_EQ(cpu_model_from_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                                   "model name\t: AMD EPYC 9654 96-Core Processor  \n"
                                   "processor\t: 1\nmodel name\t: other\n"),
            "AMD EPYC 9654 96-Core Processor");
  // Arm kernels without "model name": the field that names the CPU.
  EXPECT_EQ(cpu_model_from_cpuinfo("processor : 0\nBogoMIPS : 50.00\nHardware : Neoverse V2\n"),
            "Neoverse V2");
  // "model" (a number on x86) is not "model name"; an empty value does not count.
  EXPECT_EQ(cpu_model_from_cpuinfo("model\t\t: 17\nmodel name\t:\n"), "unknown");
  // Arm64 kernels that name nothing: the implementer and part codes.
  EXPECT_EQ(cpu_model_from_cpuinfo("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"),
            "arm implementer 0x41 part 0xd4f");
  EXPECT_EQ(cpu_model_from_cpuinfo(""), "unknown");
  const std::string here = cpu_device_name();
  EXPECT_EQ(here.rfind("cpu: ", 0), 0u) << here;
  EXPECT_GT(here.size(), 5u);
}

TEST(CliBuildInfo, UtcIso8601) {
  EXPECT_EQ(utc_iso8601(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(utc_iso8601(1796034999), "2026-11-30T10:36:39Z");
}

TEST(CliBuildInfo, DocumentHeaderKeysInTheSchemasOrder) {
  const std::time_t before = std::time(nullptr);
  const std::string head =
      json_document_header("decode", "cpu: X", "fp4attn decode --json 'a b'", "cpu").render();
  const std::time_t after = std::time(nullptr);
  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      head, m,
      std::regex("\\{\"suite\": \"decode\", \"revision\": \"([^\"]+)\", \"device\": \"cpu: X\", "
                 "\"date\": \"([^\"]+)\", \"command\": \"fp4attn decode --json 'a b'\", "
                 "\"backend\": \"cpu\", \"version\": \"([^\"]+)\"\\}")))
      << head;
  EXPECT_EQ(m[1], build_revision());
  EXPECT_EQ(m[3], build_version());
  // The date of the call (the second may turn between the clock reads).
  EXPECT_TRUE(m[2] == utc_iso8601(before) || m[2] == utc_iso8601(after)) << m[2];
}

// Progress lines go to the stream given (stderr in the programs), one per case, in order.
std::string progress_text(bool quiet) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  if (!f) return "";
  Progress p(3, quiet, f);
  for (const char* c : {"input gaussian, recipe fp8", "b", "c"}) p.next(c);
  std::rewind(f);
  std::string text;
  for (int ch; (ch = std::fgetc(f)) != EOF;) text += static_cast<char>(ch);
  std::fclose(f);
  return text;
}

TEST(CliProgress, OneLinePerCaseUnlessQuiet) {
  EXPECT_EQ(progress_text(false), "[1/3] input gaussian, recipe fp8\n[2/3] b\n[3/3] c\n");
  EXPECT_EQ(progress_text(true), "");
}

}  // namespace
}  // namespace fp4attn::cli
