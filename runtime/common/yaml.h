// YAML files (configs/models, configs/costs, job configs): the one loader, so that every YAML error reads the
// same way and names the file.
//
// Errors are one line that starts with the file: "PATH: no such file" (NotFound), "PATH:LINE: invalid YAML:
// what the parser says" (InvalidArgument), "PATH: <document> must be a YAML mapping" (InvalidArgument).
// YamlError formats the errors of the readers built on it ("PATH:LINE: message"), so that a later strict
// schema check (unknown keys with the nearest valid key, types and ranges naming the key) lives here and
// reads the same way.
//
// Thread safety: reentrant; nothing is shared between calls.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "runtime/common/status.h"

namespace eldr {

// Parses the file at `path`; its root must be a mapping. `document` names what the file is in the mapping
// error ("a model config", "a cost model").
Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& document = "a YAML file");

// InvalidArgument "PATH:LINE: message", LINE (1-based) from `at`'s mark; "PATH: message" when `at` has none
// (a node that is not in the file, e.g. a missing key).
Status YamlError(const std::string& path, const YAML::Node& at, const std::string& message);

}  // namespace eldr
