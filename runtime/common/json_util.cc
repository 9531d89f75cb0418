#include "runtime/common/json_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "runtime/common/atomic_file.h"

namespace eldr {

std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::ostringstream os;
  auto emit = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      if (c) os << "  ";
      if (c == 0) {
        os << cell << std::string(width[c] - cell.size(), ' ');
      } else {
        os << std::string(width[c] - cell.size(), ' ') << cell;
      }
    }
    os << "\n";
  };
  emit(header);
  size_t total = 0;
  for (auto w : width) total += w;
  os << std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') << "\n";
  for (const auto& r : rows) emit(r);
  return os.str();
}

std::string Fmt(double value, int decimals) {
  if (std::isnan(value)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf;
}

namespace {

// nlohmann's DOM builder with the keys of each open object tracked, to find a key given twice. (The callback parser
// would do it too, but on each object's end it scans the enclosing object for discarded values: quadratic in the
// members of an object whose members are objects, 18 s for a load profile of 40 000 layers.)
class DuplicateKeySax {
 public:
  using json = nlohmann::json;
  explicit DuplicateKeySax(json* root) : dom_(*root, /*allow_exceptions=*/true) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& text) { return dom_.number_float(v, text); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second && duplicate_.empty()) duplicate_ = k;
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(position, token, e);  // throws: allow_exceptions
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<std::unordered_set<std::string>> keys_;  // [open objects] the keys seen in each
  std::string duplicate_;
};

}  // namespace

Result<nlohmann::json> ParseJson(const std::string& text) {
  using json = nlohmann::json;
  json j;
  DuplicateKeySax sax(&j);
  try {
    json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    return Status::InvalidArgument("not valid JSON (" + PrintableMessage(e.what()) + ")");
  }
  if (!sax.duplicate().empty()) {
    return Status::InvalidArgument("duplicate key \"" + sax.duplicate() + "\" in a JSON object");
  }
  return j;
}

std::string DumpJson(const nlohmann::json& value) {
  return value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string DumpJsonLine(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status WriteJsonFile(const std::string& path, const nlohmann::json& value) {
  return WriteFileAtomic(path, DumpJson(value) + "\n");
}

}  // namespace eldr
