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

// Builds the DOM from nlohmann's SAX events and tracks the keys of each open object, to find a key given twice. (The
// callback parser would do it too, but on each object's end it scans the enclosing object for discarded values:
// quadratic in the members of an object whose members are objects, 18 s for a load profile of 40 000 layers. The
// DOM is built here rather than by nlohmann::detail's builder, whose template parameters differ between releases.)
class DuplicateKeySax {
 public:
  using json = nlohmann::json;
  explicit DuplicateKeySax(json* root) : root_(root) {}
  bool null() { return Add(nullptr); }
  bool boolean(bool v) { return Add(v); }
  bool number_integer(json::number_integer_t v) { return Add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(v); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return Add(v); }
  bool string(json::string_t& v) { return Add(std::move(v)); }
  bool binary(json::binary_t& v) { return Add(json::binary(std::move(v))); }
  bool start_object(std::size_t /*n*/) {
    keys_.emplace_back();
    stack_.push_back(Place(json::object()));
    return true;
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second && duplicate_.empty()) duplicate_ = k;
    member_ = &(*stack_.back())[k];
    return true;
  }
  bool end_object() {
    keys_.pop_back();
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*n*/) {
    stack_.push_back(Place(json::array()));
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const Exception& e) {
    throw e;  // as json::parse does: the caller reports it
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  // The new value's place: the root, the end of the open array, or the member whose key came last. A pointer to an
  // array element is held only while that element is open, before anything else is appended to the array.
  json* Place(json&& v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    *member_ = std::move(v);
    return member_;
  }
  template <class V>
  bool Add(V&& v) {
    Place(json(std::forward<V>(v)));
    return true;
  }

  json* root_;
  std::vector<json*> stack_;                           // the open objects and arrays, innermost last
  json* member_ = nullptr;                             // the value of the object's last key
  std::vector<std::unordered_set<std::string>> keys_;  // [open objects] the keys seen in each
  std::string duplicate_;
};

}  // namespace

std::string JsonErrorText(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

Result<nlohmann::json> ParseJson(const std::string& text) {
  using json = nlohmann::json;
  json j;
  DuplicateKeySax sax(&j);
  try {
    json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    return Status::InvalidArgument("not valid JSON (" + JsonErrorText(e) + ")");
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
