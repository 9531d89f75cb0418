#include "runtime/common/yaml.h"

#include <yaml-cpp/depthguard.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "runtime/common/atomic_file.h"

namespace eldr {

Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& document) {
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, document + " file"));
  ELDR_RETURN_IF_ERROR(CheckTextFile(path, "expected " + document + " (YAML)"));
  YAML::Node root;
  try {
    // Every document of the file: a second one (after "---" or "...") would otherwise be dropped unread.
    // (An empty one after a trailing "---" is nothing dropped.)
    const std::vector<YAML::Node> documents = YAML::LoadAllFromFile(path);
    const auto extra = std::find_if(documents.begin() + std::min<size_t>(documents.size(), 1), documents.end(),
                                    [](const YAML::Node& d) { return !d.IsNull(); });
    if (extra != documents.end()) {
      const YAML::Mark mark = extra->Mark();
      return Status::InvalidArgument(path + (mark.is_null() ? "" : ":" + std::to_string(mark.line + 1)) +
                                     ": a second YAML document; " + document +
                                     " is one document (remove the '---' "
                                     "or '...' and what follows it)");
    }
    if (!documents.empty()) root = documents[0];
  } catch (const YAML::DeepRecursion& e) {  // its message is yaml-cpp's "bad file", which would mislead
    return Status::InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) +
                                   ": invalid YAML: nested deeper than the parser's limit (" +
                                   std::to_string(e.depth()) + " levels); a config nests a few");
  } catch (const YAML::Exception& e) {
    // BadFile (no permission) has no mark: line 0 would be misleading.
    if (e.mark.is_null()) return Status::InvalidArgument(path + ": cannot read YAML: " + e.msg);
    return Status::InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  } catch (const std::exception& e) {  // the stream's own failure (an I/O error while reading)
    return Status::IoError(path + ": cannot read: " + e.what());
  }
  if (!root.IsMap()) return Status::InvalidArgument(path + ": " + document + " must be a YAML mapping");
  return root;
}

Status YamlError(const std::string& path, const YAML::Node& at, const std::string& message) {
  if (!at.IsDefined() || at.Mark().is_null()) return Status::InvalidArgument(path + ": " + message);
  return Status::InvalidArgument(path + ":" + std::to_string(at.Mark().line + 1) + ": " + message);
}

// ---- numbers ----

namespace {

// A bound as it is written: 3600, 0.1, 1e6, 1e-5 (the shortest text that reads back as v; an exponent without "+" or
// leading zeros).
std::string FormatNumber(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::trunc(v) && std::abs(v) < 1e6) {
    std::ostringstream o;
    o.precision(15);
    o << v;
    return o.str();
  }
  std::string text;
  for (int digits = 1; digits <= 17; ++digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    text = buf;
    if (std::strtod(buf, nullptr) == v) break;
  }
  const size_t e = text.find('e');
  if (e == std::string::npos) return text;
  std::string exponent = text.substr(e + 1);
  const bool negative = exponent[0] == '-';
  exponent.erase(0, exponent.find_first_not_of("+-0"));
  return text.substr(0, e + 1) + (negative ? "-" : "") + exponent;
}

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

bool NumberRange::Contains(double v) const {
  if (std::isnan(v)) return false;
  if (std::isinf(v)) return v > 0 && inf_ok;  // an unbounded end admits every finite value, not infinity
  if (v == 0 && std::signbit(v) && !negative_zero_ok) return false;
  if (v == 0 && zero_ok) return true;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  return hi_open ? v < hi : v <= hi;
}

std::string NumberRange::Describe() const {
  std::string s;
  const bool has_lo = !std::isinf(lo), has_hi = !std::isinf(hi);
  if (has_lo && has_hi) {
    s = "in " + std::string(lo_open ? "(" : "[") + FormatNumber(lo) + ", " + FormatNumber(hi) + (hi_open ? ")" : "]");
  } else if (has_lo) {
    s = (lo_open ? "> " : ">= ") + FormatNumber(lo);
  } else if (has_hi) {
    s = (hi_open ? "< " : "<= ") + FormatNumber(hi);
  } else {
    s = "a finite number";
  }
  if (zero_ok) s = "0 or " + s;
  return inf_ok ? s + " or inf" : s;
}

std::string NumberRange::Reason(double v) const {
  if (std::isnan(v)) return " (not a number)";
  if (std::isinf(v)) return " (infinite: give a finite number)";
  if (v == 0 && std::signbit(v) && !negative_zero_ok) return " (a negative zero: write 0)";
  return why.empty() ? "" : " (" + why + ")";
}

bool ParseNumber(const std::string& text, double* v) {
  const std::string t = Lower(text);
  const std::string body = !t.empty() && (t[0] == '+' || t[0] == '-') ? t.substr(1) : t;
  const double sign = !t.empty() && t[0] == '-' ? -1.0 : 1.0;
  if (body == "inf" || body == ".inf" || body == "infinity") {
    *v = sign * std::numeric_limits<double>::infinity();
    return true;
  }
  if (body == "nan" || body == ".nan") {
    *v = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (t.empty() || std::isspace(static_cast<unsigned char>(t[0]))) return false;
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  // An overflow gives ±HUGE_VAL = ±inf, which the ranges judge; an underflow to 0 keeps its sign and magnitude > 0.
  if (x == 0 && errno == ERANGE) x = std::copysign(std::numeric_limits<double>::denorm_min(), sign);
  *v = x;
  return true;
}

bool ParseInteger(const std::string& text, const IntRange& range, int64_t* v) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (end != text.c_str() + text.size() || errno == ERANGE) return false;
  if (x < range.lo || x > range.hi) return false;
  *v = x;
  return true;
}

Status CheckNumber(const std::string& name, const std::string& text, const NumberRange& range, double* v) {
  double x = 0;
  if (!ParseNumber(text, &x)) {
    return Status::InvalidArgument(name + " must be a number " + range.Describe() + ", got '" + text + "'");
  }
  if (!range.Contains(x)) {
    return Status::InvalidArgument(name + " must be " + range.Describe() + ", got '" + text + "'" + range.Reason(x));
  }
  if (v) *v = x;
  return Status::Ok();
}

Status CheckInteger(const std::string& name, const std::string& text, const IntRange& range, int64_t* v) {
  int64_t x = 0;
  if (!ParseInteger(text, range, &x)) {
    return Status::InvalidArgument(name + " must be " + range.Describe() + ", got '" + text + "'");
  }
  if (v) *v = x;
  return Status::Ok();
}

// ---- nearest key ----

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diag = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string NearestWord(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = std::max<int>(2, static_cast<int>(word.size()) / 2) + 1;
  for (const auto& c : candidates) {
    const int d = EditDistance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// ---- YamlMap ----

YamlMap::YamlMap(std::string path, YAML::Node node, std::string prefix, NullValues nulls)
    : YamlMap(std::move(path), std::move(node), std::move(prefix),
              std::make_shared<Shared>(Shared{Status::Ok(), nulls})) {}

YamlMap::YamlMap(std::string path, YAML::Node node, std::string prefix, std::shared_ptr<Shared> shared)
    : path_(std::move(path)), node_(std::move(node)), prefix_(std::move(prefix)), shared_(std::move(shared)) {
  if (!node_.IsDefined() || node_.IsNull()) {
    node_ = YAML::Node(YAML::NodeType::Map);
  } else if (!node_.IsMap()) {
    const std::string what = node_.IsSequence() ? "a list" : "'" + node_.as<std::string>("") + "'";
    structure_ = YamlError(path_, node_, (prefix_.empty() ? "the file" : prefix_) + " must be a mapping, got " + what);
    node_ = YAML::Node(YAML::NodeType::Map);
  }
}

void YamlMap::Fail(const YAML::Node& at, const std::string& message) {
  if (shared_->error.ok()) shared_->error = YamlError(path_, at, message);
}

void YamlMap::Allow(const std::string& key) {
  if (declared_.insert(key).second) declared_order_.push_back(key);
}

YAML::Node YamlMap::Value(const std::string& key, bool null_is_unset) {
  Allow(key);
  // node_[key] on a const copy: never inserts; the first of duplicate keys (Finish reports the second).
  const YAML::Node& n = node_;
  YAML::Node v = n[key];
  if (v.IsDefined() && v.IsNull() && !null_is_unset && shared_->nulls == NullValues::kRefused) {
    // At the key's line: a null value's own mark is where the parser stopped (the next line for "key:\n").
    YAML::Node at = v;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) {
        at = it->first;
        break;
      }
    }
    Fail(at, Name(key) + " has no value (nothing after '" + key + ":', or ~); give one, or delete the key for " +
                 "its default");
  }
  if (!v.IsDefined() || v.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
  return v;
}

bool YamlMap::Has(const std::string& key) const {
  const_cast<YamlMap*>(this)->Allow(key);
  const YAML::Node& n = node_;
  const YAML::Node v = n[key];
  return v.IsDefined() && !v.IsNull();
}

YamlMap& YamlMap::Section(const std::string& key) {
  auto it = sections_.find(key);
  if (it != sections_.end()) return *it->second;
  Allow(key);
  const YAML::Node& n = node_;  // a null section is an empty one (not Value's error)
  const YAML::Node raw = n[key];
  YAML::Node v = raw.IsDefined() && raw.IsNull() ? YAML::Node(YAML::NodeType::Undefined) : Value(key);
  auto section = std::unique_ptr<YamlMap>(new YamlMap(path_, v, Name(key), shared_));
  return *sections_.emplace(key, std::move(section)).first->second;
}

void YamlMap::Require(const std::string& key) {
  if (!Has(key)) Fail(YAML::Node(), Name(key) + " is required");
}

namespace {

// The scalar text of `n`, or nullopt (and a message) when it is a list or mapping.
std::optional<std::string> ScalarText(const YAML::Node& n) {
  if (!n.IsScalar()) return std::nullopt;
  return n.Scalar();
}

std::string Shown(const YAML::Node& n) {
  return n.IsSequence() ? "a list" : n.IsMap() ? "a mapping" : "'" + n.Scalar() + "'";
}

}  // namespace

void YamlMap::Get(const std::string& key, double* v, const NumberRange& range) {
  std::optional<double> o;
  GetNumber(key, &o, range, false);
  if (o) *v = *o;
}

void YamlMap::Get(const std::string& key, std::optional<double>* v, const NumberRange& range) {
  GetNumber(key, v, range, !v->has_value());
}

void YamlMap::GetNumber(const std::string& key, std::optional<double>* v, const NumberRange& range,
                        bool null_is_unset) {
  const YAML::Node n = Value(key, null_is_unset);
  if (!n) return;
  const auto text = ScalarText(n);
  double x = 0;
  if (!text || !ParseNumber(*text, &x))
    return Fail(n, Name(key) + " must be a number " + range.Describe() + ", got " + Shown(n));
  if (!range.Contains(x))
    return Fail(n, Name(key) + " must be " + range.Describe() + ", got " + Shown(n) + range.Reason(x));
  *v = x;
}

void YamlMap::Get(const std::string& key, int64_t* v, const IntRange& range) {
  const YAML::Node n = Value(key);
  if (!n) return;
  const auto text = ScalarText(n);
  int64_t x = 0;
  if (!text || !ParseInteger(*text, range, &x))
    return Fail(n, Name(key) + " must be " + range.Describe() + ", got " + Shown(n));
  *v = x;
}

void YamlMap::Get(const std::string& key, int* v, const IntRange& range) {
  IntRange r{std::max<int64_t>(range.lo, std::numeric_limits<int>::min()),
             std::min<int64_t>(range.hi, std::numeric_limits<int>::max())};
  int64_t x = *v;
  Get(key, &x, r);
  *v = static_cast<int>(x);
}

void YamlMap::Get(const std::string& key, uint64_t* v) {
  const YAML::Node n = Value(key);
  if (!n) return;
  const auto text = ScalarText(n);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = text && !text->empty() && std::isdigit(static_cast<unsigned char>((*text)[0]))
                                   ? std::strtoull(text->c_str(), &end, 10)
                                   : 0;
  if (!text || end != text->c_str() + text->size() || errno == ERANGE) {
    return Fail(n, Name(key) + " must be an integer in [0, 18446744073709551615], got " + Shown(n));
  }
  *v = x;
}

void YamlMap::Get(const std::string& key, bool* v) {
  const YAML::Node n = Value(key);
  if (!n) return;
  bool b = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b))
    return Fail(n, Name(key) + " must be true or false, got " + Shown(n));
  *v = b;
}

void YamlMap::Get(const std::string& key, std::string* v, const std::vector<std::string>& choices) {
  const YAML::Node n = Value(key, v->empty());
  if (!n) return;
  if (!n.IsScalar()) return Fail(n, Name(key) + " must be a string, got " + Shown(n));
  const std::string s = n.Scalar();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
    }
    const std::string near = NearestWord(s, choices);
    return Fail(n, Name(key) + " must be " + list + ", got '" + s + "'" +
                       (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }
  *v = s;
}

Status YamlMap::CheckKeys() const {
  ELDR_RETURN_IF_ERROR(structure_);
  std::set<std::string> seen;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const YAML::Node k = it->first;
    const std::string key = k.IsScalar() ? k.Scalar() : "?";
    if (!seen.insert(key).second) return YamlError(path_, k, "duplicate key '" + Name(key) + "'");
    if (declared_.count(key) == 0) {
      const std::string near = NearestWord(key, declared_order_);
      std::string hint;
      if (!near.empty()) {
        hint = " (did you mean '" + near + "'?)";
      } else {
        for (const auto& d : declared_order_) hint += (hint.empty() ? " (valid keys: " : ", ") + d;
        hint += hint.empty() ? " (" + (prefix_.empty() ? std::string("the file") : prefix_) + " takes no keys)" : ")";
      }
      return YamlError(path_, k, "unknown key '" + Name(key) + "'" + hint);
    }
  }
  for (const auto& [key, section] : sections_) ELDR_RETURN_IF_ERROR(section->CheckKeys());
  return Status::Ok();
}

Status YamlMap::Finish() const {
  ELDR_RETURN_IF_ERROR(CheckKeys());
  return shared_->error;
}

}  // namespace eldr
