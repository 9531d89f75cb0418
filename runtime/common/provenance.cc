#include "runtime/common/provenance.h"

#include <ctime>

#include "runtime/common/json_util.h"

namespace eldr {

std::string VersionString() {
  const BuildInfo b = GetBuildInfo();
  return "eldr " + std::string(b.version) + " (" + std::string(b.git_sha) + ", " + std::string(b.build_type) + ")";
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

nlohmann::json Provenance(const nlohmann::json& config) {
  const BuildInfo b = GetBuildInfo();
  return {{"eldr_version", std::string(b.version)},
          {"git_sha", std::string(b.git_sha)},
          {"build_type", std::string(b.build_type)},
          {"date", UtcNow()},
          {"config", config}};
}

std::string ProvenanceHeader(std::string_view tool, const nlohmann::json& config) {
  std::string text = "# " + VersionString() + " " + std::string(tool) + "\n# date " + UtcNow() + "\n";
  if (!config.is_null()) text += "# config " + DumpJsonLine(config) + "\n";
  return text;
}

}  // namespace eldr
