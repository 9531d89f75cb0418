// Provenance of every result eldr writes (metrics.json, the --json reports of route, place and simulate, the
// benchmark outputs): which build produced it, when, and from what configuration, so a figure can be traced back
// to the code and the inputs that made it. Text tables start with the same facts as `#` lines (nccl-tests style).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace eldr {

// The build this binary came from. git_sha is the commit checked out when the binary was built (12 hex digits,
// "-dirty" appended when tracked files had uncommitted changes; "unknown" outside a git checkout).
struct BuildInfo {
  std::string_view version;     // the CMake project version, e.g. "0.1.0"
  std::string_view git_sha;     // e.g. "2b2ccb5a1f3e" or "2b2ccb5a1f3e-dirty"
  std::string_view build_type;  // CMAKE_BUILD_TYPE, e.g. "Release"
};
BuildInfo GetBuildInfo();

// "eldr 0.1.0 (2b2ccb5a1f3e, Release)".
std::string VersionString();

// The current time in UTC, ISO 8601 to the second: "2026-12-01T09:30:00Z".
std::string UtcNow();

// {"eldr_version", "git_sha", "build_type", "date": UtcNow(), "config": config}. `config` is the resolved
// configuration of the run (every default filled in, every override applied); null when the command has none.
nlohmann::json Provenance(const nlohmann::json& config);

// The same facts as text, every line starting with "# ":
//   # eldr 0.1.0 (2b2ccb5a1f3e, Release) <tool>
//   # date 2026-12-01T09:30:00Z
//   # config {"decoders":16,...}            (one line; omitted when config is null)
std::string ProvenanceHeader(std::string_view tool, const nlohmann::json& config);

}  // namespace eldr
