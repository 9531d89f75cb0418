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

Result<nlohmann::json> ParseJson(const std::string& text) {
  using json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> keys;  // [open objects] the keys seen in each
  std::string duplicate;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second &&
               duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, check);
  } catch (const json::exception& e) {
    return Status::InvalidArgument("not valid JSON (" + PrintableMessage(e.what()) + ")");
  }
  if (!duplicate.empty()) return Status::InvalidArgument("duplicate key \"" + duplicate + "\" in a JSON object");
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
