// Output helpers shared by the subcommands: readable fixed-width tables and atomic JSON files.
#pragma once

#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// nlohmann::json::parse, but an object that holds a key twice is refused (parse keeps the last value silently; a
// duplicate YAML key is an error too). InvalidArgument: "not valid JSON (...)" or "duplicate key \"id\" in a JSON
// object"; the caller adds the file and line. The parser's message quotes bytes of the input as they are: the
// command line makes every error line printable (PrintableMessage, runtime/common/status.h).
Result<nlohmann::json> ParseJson(const std::string& text);

// An exception's text without nlohmann::json's "[json.exception.parse_error.101] " prefix (a library's internal
// name, meaningless to a user): "parse error at line 1, column 13: ...", "key 'kind' not found". Other exceptions'
// text as it is.
std::string JsonErrorText(const std::exception& e);

// Left-aligned first column, right-aligned others, a rule under the header.
std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
// printf-style number formatting for table cells.
std::string Fmt(double value, int decimals = 3);
// Indented JSON text; invalid UTF-8 in strings (labels read from files) is replaced, never thrown on.
std::string DumpJson(const nlohmann::json& value);
// The same on one line (JSONL).
std::string DumpJsonLine(const nlohmann::json& value);
// Writes `value` (indented) to `path` through a temporary file.
Status WriteJsonFile(const std::string& path, const nlohmann::json& value);

}  // namespace eldr
