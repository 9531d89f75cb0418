// The strict YAML schema (YamlMap): hand-written documents, each error checked against the exact line a
// reader would print. Also the shared number parsing and the nearest-key suggestion.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "runtime/common/yaml.h"

namespace eldr {
namespace {

// A schema like a small job config: topology {prefill_ranks, decode_ranks}, routing {tau, policy},
// watchdog_s, tokens.
struct Small {
  int prefill = 1, decode = 1;
  std::optional<double> tau;
  std::string policy = "eldr";
  double watchdog_s = 120;
  bool tokens = false;
};

Status Read(const std::string& text, Small* s) {
  YamlMap root("job.yaml", YAML::Load(text));
  YamlMap& topology = root.Section("topology");
  topology.Get("prefill_ranks", &s->prefill, IntRange::Between(1, 64));
  topology.Get("decode_ranks", &s->decode, IntRange::Between(1, 64));
  YamlMap& routing = root.Section("routing");
  routing.Get("tau", &s->tau, NumberRange::AtLeast(0));
  routing.Get("policy", &s->policy, {"eldr", "jsq", "random"});
  root.Get("watchdog_s", &s->watchdog_s, NumberRange::Above(0));
  root.Get("tokens", &s->tokens);
  return root.Finish();
}

std::string Error(const std::string& text) {
  Small s;
  const Status st = Read(text, &s);
  return st.ok() ? "OK" : st.message();
}

TEST(YamlMapTest, ReadsEveryKeyAndKeepsDefaultsOfAbsentOnes) {
  Small s;
  ASSERT_TRUE(Read("topology: {decode_ranks: 4}\nrouting: {tau: 0.25}\nwatchdog_s: 8\ntokens: true\n", &s).ok());
  EXPECT_EQ(s.prefill, 1);
  EXPECT_EQ(s.decode, 4);
  ASSERT_TRUE(s.tau.has_value());
  EXPECT_DOUBLE_EQ(*s.tau, 0.25);
  EXPECT_DOUBLE_EQ(s.watchdog_s, 8);
  EXPECT_TRUE(s.tokens);
  EXPECT_EQ(s.policy, "eldr");
}

TEST(YamlMapTest, UnsetIsNotAValue) {
  Small s;
  ASSERT_TRUE(Read("routing: {policy: jsq}\n", &s).ok());
  EXPECT_FALSE(s.tau.has_value());
  Small z;
  ASSERT_TRUE(Read("routing: {tau: 0}\n", &z).ok());  // 0 is a value, not "unset"
  EXPECT_EQ(z.tau, 0.0);
}

// "key:" with nothing after it (or ~) is a forgotten value where the key's default is a value: never that default
// (an empty watchdog_s used to run with 120 s). Where the default is "unset" (an optional number, an empty string)
// a null is that, as absence is. A section whose every line is commented out is an empty section.
TEST(YamlMapTest, ANullValueIsAnErrorWhereTheDefaultIsAValue) {
  const std::string hint = " has no value (nothing after '";
  EXPECT_EQ(Error("watchdog_s:\n"),
            "job.yaml:1: watchdog_s" + hint + "watchdog_s:', or ~); give one, or delete the key for its default");
  EXPECT_EQ(Error("watchdog_s: 8\ntokens: ~\n").rfind("job.yaml:2: tokens" + hint, 0), 0u) << Error("tokens: ~\n");
  EXPECT_EQ(Error("routing: {policy: }\n").rfind("job.yaml:1: routing.policy" + hint, 0), 0u);
  EXPECT_EQ(Error("topology: {decode_ranks: ~}\n").rfind("job.yaml:1: topology.decode_ranks" + hint, 0), 0u);
  Small t;
  ASSERT_TRUE(Read("routing: {tau:}\n", &t).ok());  // an optional: unset, as absent
  EXPECT_FALSE(t.tau.has_value());
  Small s;
  ASSERT_TRUE(Read("routing:\n  # tau: 0.1\nwatchdog_s: 8\n", &s).ok());
  EXPECT_FALSE(s.tau.has_value());
  // Hugging Face's config.json writes null for "unset": NullValues::kAbsent reads it so.
  YamlMap hf("config.json", YAML::Load("{\"head_dim\": null}"), "", NullValues::kAbsent);
  int head_dim = 7;
  hf.Get("head_dim", &head_dim, IntRange::Between(1, 1024));
  EXPECT_TRUE(hf.Finish().ok()) << hf.Finish().message();
  EXPECT_EQ(head_dim, 7);
}

TEST(YamlMapTest, UnknownKeyNamesItsLineAndTheNearestKey) {
  EXPECT_EQ(Error("topology: {decode_ranks: 2}\nwatchdgo_s: 8\n"),
            "job.yaml:2: unknown key 'watchdgo_s' (did you mean 'watchdog_s'?)");
  EXPECT_EQ(Error("routing:\n  tau: 0.1\n  polcy: jsq\n"),
            "job.yaml:3: unknown key 'routing.polcy' (did you mean 'policy'?)");
  EXPECT_EQ(Error("routnig: {tau: 1}\n"), "job.yaml:1: unknown key 'routnig' (did you mean 'routing'?)");
  // Nothing close: the valid keys are listed.
  EXPECT_EQ(Error("topology: {zzzzzzzzzzzzzzz: 1}\n"),
            "job.yaml:1: unknown key 'topology.zzzzzzzzzzzzzzz' (valid keys: prefill_ranks, decode_ranks)");
}

TEST(YamlMapTest, UnknownKeyWinsOverTheErrorItCauses) {
  // The misspelt key is the cause; a value error elsewhere comes second.
  EXPECT_EQ(Error("watchdog_s: -1\nwatchdgo_s: 8\n"),
            "job.yaml:2: unknown key 'watchdgo_s' (did you mean 'watchdog_s'?)");
}

TEST(YamlMapTest, RangeErrorsNameTheDottedKeyAndTheValue) {
  EXPECT_EQ(Error("routing: {tau: -0.5}\n"), "job.yaml:1: routing.tau must be >= 0, got '-0.5'");
  EXPECT_EQ(Error("routing: {tau: .nan}\n"), "job.yaml:1: routing.tau must be >= 0, got '.nan' (not a number)");
  EXPECT_EQ(Error("routing: {tau: .inf}\n"),
            "job.yaml:1: routing.tau must be >= 0, got '.inf' (infinite: give a finite number)");
  EXPECT_EQ(Error("routing: {tau: fast}\n"), "job.yaml:1: routing.tau must be a number >= 0, got 'fast'");
  EXPECT_EQ(Error("watchdog_s: 0\n"), "job.yaml:1: watchdog_s must be > 0, got '0'");
  EXPECT_EQ(Error("topology: {decode_ranks: 0}\n"),
            "job.yaml:1: topology.decode_ranks must be an integer in [1, 64], got '0'");
}

TEST(YamlMapTest, FractionalOrHugeIntegerSaysInteger) {
  EXPECT_EQ(Error("topology: {decode_ranks: 2.5}\n"),
            "job.yaml:1: topology.decode_ranks must be an integer in [1, 64], got '2.5'");
  EXPECT_EQ(Error("topology: {decode_ranks: 99999999999999999999}\n"),
            "job.yaml:1: topology.decode_ranks must be an integer in [1, 64], got '99999999999999999999'");
  EXPECT_EQ(Error("topology: {decode_ranks: 1e3}\n"),
            "job.yaml:1: topology.decode_ranks must be an integer in [1, 64], got '1e3'");
}

TEST(YamlMapTest, AListWhereAMappingIsExpected) {
  EXPECT_EQ(Error("topology: [1, 4]\n"), "job.yaml:1: topology must be a mapping, got a list");
  EXPECT_EQ(Error("topology: 4\n"), "job.yaml:1: topology must be a mapping, got '4'");
  EXPECT_EQ(Error("routing: {tau: [0.1]}\n"), "job.yaml:1: routing.tau must be a number >= 0, got a list");
}

TEST(YamlMapTest, DuplicateKeysAreErrors) {
  EXPECT_EQ(Error("watchdog_s: 8\nwatchdog_s: 9\n"), "job.yaml:2: duplicate key 'watchdog_s'");
  EXPECT_EQ(Error("routing:\n  tau: 0.1\n  tau: 0.2\n"), "job.yaml:3: duplicate key 'routing.tau'");
}

TEST(YamlMapTest, ChoicesAndBooleans) {
  EXPECT_EQ(Error("routing: {policy: jsk}\n"),
            "job.yaml:1: routing.policy must be eldr, jsq or random, got 'jsk' (did you mean 'jsq'?)");
  EXPECT_EQ(Error("tokens: maybe\n"), "job.yaml:1: tokens must be true or false, got 'maybe'");
}

TEST(YamlMapTest, RequireAndAllow) {
  YamlMap root("m.yaml", YAML::Load("name: x\nextra: {a: 1}\n"));
  std::string name;
  root.Get("name", &name);
  root.Allow("extra");
  root.Require("hidden_size");
  EXPECT_EQ(root.Finish().message(), "m.yaml: hidden_size is required");
}

TEST(YamlMapTest, EmptyDocumentReadsAsDefaults) {
  Small s;
  EXPECT_TRUE(Read("", &s).ok());
  EXPECT_EQ(s.decode, 1);
}

TEST(NumberTest, ParseNumberAcceptsYamlAndCommandLineForms) {
  double v = 0;
  ASSERT_TRUE(ParseNumber("1e-3", &v));
  EXPECT_DOUBLE_EQ(v, 1e-3);
  for (const char* inf : {"inf", ".inf", ".Inf", "infinity", "+inf"}) {
    ASSERT_TRUE(ParseNumber(inf, &v)) << inf;
    EXPECT_TRUE(std::isinf(v) && v > 0) << inf;
  }
  ASSERT_TRUE(ParseNumber("-.inf", &v));
  EXPECT_TRUE(std::isinf(v) && v < 0);
  ASSERT_TRUE(ParseNumber("nan", &v));
  EXPECT_TRUE(std::isnan(v));
  EXPECT_FALSE(ParseNumber("", &v));
  EXPECT_FALSE(ParseNumber("1.5x", &v));
  EXPECT_FALSE(ParseNumber(" 1", &v));
}

TEST(NumberTest, RangesDescribeThemselvesAndJudgeInfAndNan) {
  const double inf = std::numeric_limits<double>::infinity();
  const NumberRange rate = NumberRange::Above(0).OrInf();
  EXPECT_EQ(rate.Describe(), "> 0 or inf");
  EXPECT_TRUE(rate.Contains(inf));
  EXPECT_TRUE(rate.Contains(1e-9));
  EXPECT_FALSE(rate.Contains(0));
  EXPECT_FALSE(rate.Contains(std::nan("")));
  const NumberRange tau = NumberRange::AtLeast(0);
  EXPECT_EQ(tau.Describe(), ">= 0");
  EXPECT_TRUE(tau.Contains(0));
  EXPECT_FALSE(tau.Contains(inf));
  EXPECT_FALSE(tau.Contains(-1e-300));
  const NumberRange frac{0, 1, false, true};
  EXPECT_EQ(frac.Describe(), "in [0, 1)");
  EXPECT_FALSE(frac.Contains(1));
  EXPECT_EQ(IntRange::Between(1, 127).Describe(), "an integer in [1, 127]");
}

TEST(NumberTest, ALiteralThatUnderflowsIsNeverZero) {
  // strtod gives 0 for 1e-400: a range that admits 0 ("none") took it for 0. It keeps its sign and stays nonzero.
  double v = 0;
  ASSERT_TRUE(ParseNumber("1e-400", &v));
  EXPECT_GT(v, 0);
  EXPECT_LT(v, 1e-300);
  ASSERT_TRUE(ParseNumber("-1e-400", &v));
  EXPECT_LT(v, 0);
  EXPECT_FALSE(CheckNumber("--tau", "-1e-400", NumberRange::AtLeast(0)).ok());
  ASSERT_TRUE(ParseNumber("0e-400", &v));  // a zero is a zero
  EXPECT_EQ(v, 0);
  EXPECT_FALSE(std::signbit(v));
  ASSERT_TRUE(ParseNumber("-0", &v));
  EXPECT_TRUE(v == 0 && std::signbit(v));
  ASSERT_TRUE(ParseNumber("1e-320", &v));  // a subnormal is kept as it is
  EXPECT_DOUBLE_EQ(v, 1e-320);
}

TEST(NumberTest, PhysicalRangesRefuseANegativeZeroAndSayWhy) {
  const NumberRange link = NumberRange::Physical(1e6, 1e13, "bytes/s").OrZero();
  EXPECT_EQ(link.Describe(), "0 or in [1e6, 1e13]");
  for (double ok : {0.0, 1e6, 5e9, 1e13}) EXPECT_TRUE(link.Contains(ok)) << ok;
  for (double bad : {-0.0, 1e30, 1e-9, 9.99e5, 1.01e13, -5e9}) EXPECT_FALSE(link.Contains(bad)) << bad;
  EXPECT_EQ(link.Reason(1e30), " (bytes/s)");
  EXPECT_EQ(link.Reason(-0.0), " (a negative zero: write 0)");
  EXPECT_EQ(CheckNumber("--bw", "1e30", link).message(), "--bw must be 0 or in [1e6, 1e13], got '1e30' (bytes/s)");
  EXPECT_EQ(CheckNumber("--bw", "-0", link).message(),
            "--bw must be 0 or in [1e6, 1e13], got '-0' (a negative zero: write 0)");
  EXPECT_EQ(CheckNumber("--bw", "fast", link).message(), "--bw must be a number 0 or in [1e6, 1e13], got 'fast'");
  EXPECT_TRUE(CheckNumber("--bw", "5e9", link).ok());
  const NumberRange seconds = NumberRange::Physical(0, 3600, "");
  EXPECT_TRUE(seconds.Contains(0));
  EXPECT_FALSE(seconds.Contains(-0.0));
  EXPECT_EQ(seconds.Reason(7200), "");
  EXPECT_TRUE(NumberRange::AtLeast(0).Contains(-0.0));  // not a physical quantity: -0 is 0, as before
  // Bounds are written as they would be typed.
  EXPECT_EQ(NumberRange::Between(0.1, 65536).Describe(), "in [0.1, 65536]");
  EXPECT_EQ(NumberRange::Between(1e-5, 2.5e14).Describe(), "in [1e-5, 2.5e14]");
  // In a YAML document: the line, the dotted key, the value as written, the reason.
  YamlMap root("cost.yaml", YAML::Load("kv_transfer: {bandwidth_Bps: 1.0e30}\n"));
  double bw = 0;
  root.Section("kv_transfer").Get("bandwidth_Bps", &bw, link);
  EXPECT_EQ(root.Finish().message(),
            "cost.yaml:1: kv_transfer.bandwidth_Bps must be 0 or in [1e6, 1e13], got '1.0e30' (bytes/s)");
}

TEST(NumberTest, CheckMessagesNameTheOption) {
  EXPECT_EQ(CheckNumber("--tau", "nan", NumberRange::AtLeast(0)).message(),
            "--tau must be >= 0, got 'nan' (not a number)");
  EXPECT_EQ(CheckNumber("--rate", "x", NumberRange::Above(0).OrInf()).message(),
            "--rate must be a number > 0 or inf, got 'x'");
  EXPECT_TRUE(CheckNumber("--rate", "inf", NumberRange::Above(0).OrInf()).ok());
  EXPECT_EQ(CheckInteger("-n", "-5", IntRange::AtLeast(0)).message(),
            "-n must be an integer in [0, 9223372036854775807], got '-5'");
  int64_t v = 0;
  EXPECT_TRUE(CheckInteger("-n", "12", IntRange::AtLeast(0), &v).ok());
  EXPECT_EQ(v, 12);
}

TEST(NearestWordTest, EditDistanceAndSuggestion) {
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("", "abc"), 3);
  EXPECT_EQ(EditDistance("max_btach", "max_batch"), 2);
  EXPECT_EQ(NearestWord("max_btach", {"ep_size", "max_batch", "placement"}), "max_batch");
  EXPECT_EQ(NearestWord("zzzz", {"max_batch", "placement"}), "");
}

}  // namespace
}  // namespace eldr
