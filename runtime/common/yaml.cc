#include "runtime/common/yaml.h"

#include <filesystem>

namespace eldr {

Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& document) {
  if (!std::filesystem::exists(path)) return Status::NotFound(path + ": no such file");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    // BadFile (a directory, no permission) has no mark: line 0 would be misleading.
    if (e.mark.is_null()) return Status::InvalidArgument(path + ": cannot read YAML: " + e.msg);
    return Status::InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::InvalidArgument(path + ": " + document + " must be a YAML mapping");
  return root;
}

Status YamlError(const std::string& path, const YAML::Node& at, const std::string& message) {
  if (!at.IsDefined() || at.Mark().is_null()) return Status::InvalidArgument(path + ": " + message);
  return Status::InvalidArgument(path + ":" + std::to_string(at.Mark().line + 1) + ": " + message);
}

}  // namespace eldr
