// YAML files (configs/models, configs/costs, job configs): the one loader, so that every YAML error reads the
// same way and names the file.
//
// Errors are one line that starts with the file: "PATH: no such file" (NotFound), "PATH: is a directory,
// expected <document>", "PATH:LINE: invalid YAML: what the parser says" (InvalidArgument), "PATH: <document>
// must be a YAML mapping" (InvalidArgument). YamlError formats the errors of the readers built on it
// ("PATH:LINE: message").
//
// YamlMap is the strict schema every reader uses: each getter names a key of the schema (with its type and
// range), and Finish() reports a key that no getter asked for ("unknown key 'watchdgo_s' (did you mean
// 'watchdog_s'?)"), a key given twice, or the first type/range error, by its dotted name and line.
//
// Thread safety: reentrant; nothing is shared between calls.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// Parses the file at `path`; its root must be a mapping. `document` names what the file is in the mapping
// error ("a model config", "a cost model").
Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& document = "a YAML file");

// InvalidArgument "PATH:LINE: message", LINE (1-based) from `at`'s mark; "PATH: message" when `at` has none
// (a node that is not in the file, e.g. a missing key).
Status YamlError(const std::string& path, const YAML::Node& at, const std::string& message);

// The valid values of a number: [lo, hi] with either end open, and whether +inf is also valid (a rate: "all at
// once"). NaN is never valid. Describe() is the phrase of the messages: ">= 0", "> 0 or inf", "in [1, 127]",
// "0 or in [1e6, 1e13]".
//
// A physical quantity (a time, a bandwidth, a core count: Physical()) also refuses a negative zero (a sign typed by
// mistake) and carries `why`, the reason for its bounds, which the messages add after the value; OrZero() admits 0
// besides its bounds where 0 means "none" (a KV link that costs nothing, no shared cores).
struct NumberRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool inf_ok = false;           // +inf valid besides [lo, hi]
  bool zero_ok = false;          // 0 valid besides [lo, hi]
  bool negative_zero_ok = true;  // false: -0 is refused
  std::string why{};             // the reason for the bounds (may be empty)

  static NumberRange AtLeast(double lo) { return {lo}; }
  static NumberRange Above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true}; }
  static NumberRange Between(double lo, double hi) { return {lo, hi}; }
  // [lo, hi], -0 refused, `why` in the messages.
  static NumberRange Physical(double lo, double hi, std::string why) {
    NumberRange r{lo, hi};
    r.negative_zero_ok = false;
    r.why = std::move(why);
    return r;
  }
  NumberRange OrInf() const {
    NumberRange r = *this;
    r.inf_ok = true;
    return r;
  }
  NumberRange OrZero() const {
    NumberRange r = *this;
    r.zero_ok = true;
    return r;
  }
  bool Contains(double v) const;
  std::string Describe() const;
  // What the messages add after a refused value v: " (a negative zero: write 0)", " (why)", or "".
  std::string Reason(double v) const;
};
// A number, or an integer in [lo, hi] (Describe: "an integer in [1, 2147483647]").
struct IntRange {
  int64_t lo = std::numeric_limits<int64_t>::min();
  int64_t hi = std::numeric_limits<int64_t>::max();
  static IntRange AtLeast(int64_t lo) { return {lo}; }
  static IntRange Between(int64_t lo, int64_t hi) { return {lo, hi}; }
  std::string Describe() const { return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }
};

// Parses a number as YAML and the command line write it: decimal or exponent form, inf/.inf/infinity, nan/.nan
// (then rejected by every range). A nonzero literal too small for a double ("1e-400") keeps its sign as the smallest
// subnormal, so that a range judges it as the tiny number it is, never as 0 (a KV link of 1e-400 B/s is not a free
// one). False when `text` is not a number.
bool ParseNumber(const std::string& text, double* v);
// Parses a whole integer (no fraction, no exponent, no trailing text) in `range`.
bool ParseInteger(const std::string& text, const IntRange& range, int64_t* v);
// InvalidArgument "NAME must be RANGE, got TEXT" (and the range's Reason) unless `text` is a number in `range` (NAME:
// a dotted key or an option such as --tau). The CLI validators and YamlMap share it, so an override is checked like its
// key.
Status CheckNumber(const std::string& name, const std::string& text, const NumberRange& range, double* v = nullptr);
Status CheckInteger(const std::string& name, const std::string& text, const IntRange& range, int64_t* v = nullptr);

// The Levenshtein distance between a and b (for "did you mean").
int EditDistance(const std::string& a, const std::string& b);
// The string of `candidates` nearest to `word`, or "" when none is close (distance > max(2, |word| / 2)).
std::string NearestWord(const std::string& word, const std::vector<std::string>& candidates);

// A YAML mapping read against a schema. Every getter declares its key (whether or not the file has it); an
// absent value leaves the destination as it is. A null value ("key:" with nothing after it, or "~") is an error
// naming the key where the key's default is a value (watchdog_s: 120, output.dir: run): a forgotten value is never
// read as that default. Where the default is "unset" itself (an empty string, an unset optional) a null is that,
// as absence is; and everywhere with NullValues::kAbsent (Hugging Face's config.json, where null means "unset"). A null
// section ("decode:" with every line under it commented out) reads as an empty mapping. The first error is kept;
// Finish() returns it, after the structural errors that explain it (an unknown key, a duplicate key, a section that is
// not a mapping), checked over this map and every Section() of it.
//
// Errors: "PATH:LINE: NAME must be RANGE, got VALUE", "PATH:LINE: unknown key 'NAME' (did you mean 'KEY'?)",
// "PATH:LINE: duplicate key 'NAME'", "PATH:LINE: NAME must be a mapping, got a list", "PATH: NAME is required".
//
// Not thread-safe; a map and its sections live as long as the root.
enum class NullValues { kRefused, kAbsent };
class YamlMap {
 public:
  // `node`: the mapping (an undefined or null node reads as empty). `prefix`: its dotted name ("" at the root).
  YamlMap(std::string path, YAML::Node node, std::string prefix = "", NullValues nulls = NullValues::kRefused);
  YamlMap(const YamlMap&) = delete;
  YamlMap& operator=(const YamlMap&) = delete;

  // The sub-mapping at `key` (empty when absent); an error when it is there but not a mapping.
  YamlMap& Section(const std::string& key);
  // Declares keys that another reader checks (e.g. the job config's `simulate:` section, read by the cost
  // model): they are not unknown here.
  void Allow(const std::string& key);

  void Get(const std::string& key, double* v, const NumberRange& range);
  void Get(const std::string& key, std::optional<double>* v, const NumberRange& range);
  void Get(const std::string& key, int* v, const IntRange& range);
  void Get(const std::string& key, int64_t* v, const IntRange& range);
  void Get(const std::string& key, uint64_t* v);  // a seed: any non-negative 64-bit integer
  void Get(const std::string& key, bool* v);
  // A scalar string; `choices` (when not empty) are its valid values.
  void Get(const std::string& key, std::string* v, const std::vector<std::string>& choices = {});
  // Records "NAME is required" unless the file has `key` with a non-null value.
  void Require(const std::string& key);
  bool Has(const std::string& key) const;  // with a non-null value; declares the key

  // The dotted name of `key` in this map ("routing.tau").
  std::string Name(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  // The first structural error, else the first value error, else OK.
  Status Finish() const;

 private:
  struct Shared {  // one per root: the first value error of the whole tree
    Status error;
    NullValues nulls = NullValues::kRefused;
  };
  YamlMap(std::string path, YAML::Node node, std::string prefix, std::shared_ptr<Shared> shared);
  // The value at `key` (declaring it), or an undefined node when absent or null. A null is an error (with
  // kRefused) unless `null_is_unset`: the key's default is "unset" itself (an empty path, an optional number), so
  // that "calibration:" with nothing means no calibration, as absence does.
  YAML::Node Value(const std::string& key, bool null_is_unset = false);
  void GetNumber(const std::string& key, std::optional<double>* v, const NumberRange& range, bool null_is_unset);
  void Fail(const YAML::Node& at, const std::string& message);
  Status CheckKeys() const;

  std::string path_;
  YAML::Node node_;
  std::string prefix_;
  std::shared_ptr<Shared> shared_;
  Status structure_;  // this map is not a mapping
  std::set<std::string> declared_;
  std::vector<std::string> declared_order_;
  std::map<std::string, std::unique_ptr<YamlMap>> sections_;
};

}  // namespace eldr
