// Expert-load readers: the JSON expert-score profiles and a plain [L, E] HDF5 dataset.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "placement/placement.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"

namespace eldr {

namespace {

// Bounds of an HDF5 load's declared shape (the project's expert ids are < 65536; no model has more layers).
constexpr hsize_t kMaxLoadLayers = 65535;
constexpr hsize_t kMaxLoadExperts = 65535;

// A non-negative decimal integer key without leading zeros such as "46" (so keys map one-to-one to ids).
bool ParseIndex(const std::string& key, int64_t* value) {
  if (key.empty() || key.size() > 9 || (key.size() > 1 && key[0] == '0')) return false;
  int64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

Status CheckLoadValue(const std::string& where, double v) {
  if (!std::isfinite(v) || v < 0) {
    return Status::InvalidArgument(where + " is " + std::to_string(v) + "; loads must be finite and >= 0");
  }
  return Status::Ok();
}

// Every load finite and >= 0, not all 0, and their total small enough that the sums and products of balancedness stay
// finite (a load of 1e308 is finite, its sum over a layer is not).
Status CheckLoadTotal(const std::string& where, const std::vector<double>& load) {
  constexpr double kMaxTotal = 1e300;
  double total = 0;
  for (double v : load) total += v;
  if (!(total <= kMaxTotal)) {
    return Status::InvalidArgument(where + ": the loads sum to " + Fmt(total, 0) +
                                   ", above 1e300 (balancedness would overflow); scale them down");
  }
  // A profile of zeros places by nothing (any placement is "balanced", balancedness 0/0 reported as 1).
  if (total == 0) {
    return Status::InvalidArgument(where +
                                   ": every load is 0, so there is nothing to balance (a profile recorded before any "
                                   "traffic?); give a profile of recorded expert loads");
  }
  return Status::Ok();
}

// One member of a JSON load profile, {"<layer>": {"<expert>": load}}, as [L, E] (see ReadLoadJson).
Result<std::vector<double>> ParseLoadMember(const std::string& path, const std::string& name,
                                            const nlohmann::json& scores, int* num_layers, int* num_experts) {
  using json = nlohmann::json;
  if (!scores.is_object()) {
    return Status::Corrupt(path + ": \"" + name + "\" must be an object {layer: {expert: load}}");
  }
  if (scores.empty()) return Status::Corrupt(path + ": \"" + name + "\" has no layers");
  std::vector<std::pair<int64_t, const json*>> layers;
  layers.reserve(scores.size());
  for (auto it = scores.begin(); it != scores.end(); ++it) {
    int64_t id = 0;
    if (!ParseIndex(it.key(), &id) || !it.value().is_object()) {
      return Status::Corrupt(path + ": " + name + "[\"" + it.key() +
                             "\"] must be a numeric layer id mapping to {expert: load}");
    }
    layers.emplace_back(id, &it.value());
  }
  if (layers.size() > kMaxLoadLayers) {
    return Status::InvalidArgument(path + ": " + name + " has " + std::to_string(layers.size()) +
                                   " layers; a load has at most " + std::to_string(kMaxLoadLayers));
  }
  std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const int L = static_cast<int>(layers.size());
  for (int l = 1; l < L; ++l) {
    const int64_t expected = layers[0].first + l;
    if (layers[l].first != expected) {  // "0", "1", "5" would be renumbered 0, 1, 2
      return Status::Corrupt(path + ": " + name + " layer keys must be consecutive; layer \"" +
                             std::to_string(expected) + "\" is missing (after \"" + std::to_string(expected - 1) +
                             "\" comes \"" + std::to_string(layers[l].first) + "\")");
    }
  }
  // E is one more than the largest expert key of any layer, so that a layer lacking an expert is named as such
  // (taking E from the first layer's size would report the other layers' last expert as out of range).
  int64_t max_expert = -1;
  for (const auto& [id, row] : layers) {
    for (auto it = row->begin(); it != row->end(); ++it) {
      int64_t e = 0;
      if (!ParseIndex(it.key(), &e) || e >= static_cast<int64_t>(kMaxLoadExperts)) {
        return Status::Corrupt(path + ": " + name + "[\"" + std::to_string(id) + "\"] has expert key \"" + it.key() +
                               "\"; expert keys are whole numbers 0.." + std::to_string(kMaxLoadExperts - 1));
      }
      max_expert = std::max(max_expert, e);
    }
  }
  if (max_expert < 0) return Status::Corrupt(path + ": no layer of " + name + " has an expert");
  const int E = static_cast<int>(max_expert + 1);
  std::vector<double> load(static_cast<size_t>(L) * E, -1.0);
  for (int l = 0; l < L; ++l) {
    const std::string layer = name + "[\"" + std::to_string(layers[l].first) + "\"]";
    const json& row = *layers[l].second;
    if (static_cast<int>(row.size()) != E) {  // keys are distinct and < E: some expert is missing
      int missing = 0;
      while (row.contains(std::to_string(missing))) ++missing;
      return Status::Corrupt(path + ": " + layer + " lacks expert \"" + std::to_string(missing) +
                             "\" (every layer needs the experts 0.." + std::to_string(E - 1) +
                             ", the largest key of any layer)");
    }
    for (auto it = row.begin(); it != row.end(); ++it) {
      int64_t e = 0;
      ParseIndex(it.key(), &e);  // checked above
      if (!it.value().is_number()) {
        return Status::Corrupt(path + ": " + layer + "[\"" + it.key() + "\"] is not a number");
      }
      const double v = it.value().get<double>();
      ELDR_RETURN_IF_ERROR(CheckLoadValue(path + ": " + layer + "[\"" + it.key() + "\"]", v));
      load[static_cast<size_t>(l) * E + e] = v;
    }
  }
  ELDR_RETURN_IF_ERROR(CheckLoadTotal(path, load));
  *num_layers = L;
  *num_experts = E;
  return load;
}

}  // namespace

Result<std::vector<double>> ReadLoadJson(const std::string& path, const std::string& member, int* num_layers,
                                         int* num_experts) {
  using json = nlohmann::json;
  if (member != "token_scores" && member != "gate_scores") {
    return Status::InvalidArgument(
        path + ": a JSON load profile has the members \"token_scores\" and \"gate_scores\", not \"" + member + "\"");
  }
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, "a load JSON file"));
  // The text and its DOM, before either is read: a member "7": 0.1 of a dozen bytes becomes a map node, a key and a
  // value of about 130 bytes, so up to 16 bytes per byte of the file (a 16.8 MB profile of 40 000 layers took 76 MB).
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) {
    ELDR_RETURN_IF_ERROR(
        CheckMemoryBudget(17.0 * static_cast<double>(size), path + ": parsing this JSON load profile"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(path + ": cannot open for reading");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto parsed = ParseJson(text);
  if (!parsed.ok()) return Status::Corrupt(path + ": " + parsed.status().message());
  const json doc = std::move(parsed).value();
  if (!doc.is_object() || !doc.contains(member) || !doc.at(member).is_object()) {
    return Status::Corrupt(path + ": expected an object with \"" + member + "\": {layer: {expert: load}}");
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {  // a misspelt key is never silently ignored
    if (it.key() != "token_scores" && it.key() != "gate_scores") {
      return Status::Corrupt(path + ": unknown key \"" + it.key() +
                             "\" (a load profile holds \"token_scores\" and optionally \"gate_scores\")");
    }
  }
  // The member not read is checked as well: a damaged file is refused whichever member a run asks for.
  for (const auto& [name, scores] : doc.items()) {
    if (name == member) continue;
    int L = 0, E = 0;
    ELDR_RETURN_IF_ERROR(ParseLoadMember(path, name, scores, &L, &E).status());
  }
  return ParseLoadMember(path, member, doc.at(member), num_layers, num_experts);
}

Result<std::vector<double>> ReadLoadHdf5(const std::string& path, const std::string& dataset, int* num_layers,
                                         int* num_experts) {
  ELDR_ASSIGN_OR_RETURN(h5::File file, h5::File::OpenReadOnly(path));
  if (!file.Exists(dataset)) return Status::NotFound(path + ": no dataset " + dataset);
  // The declared shape is checked before anything is allocated: a chunked dataset may declare billions of
  // never-written elements in a file of a few KB.
  ELDR_ASSIGN_OR_RETURN(h5::Dims shape, file.Shape(dataset));
  if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1 || shape[0] > kMaxLoadLayers || shape[1] > kMaxLoadExperts) {
    std::string got;
    for (size_t i = 0; i < shape.size(); ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
    return Status::InvalidArgument(path + ": " + dataset + " is [" + got + "]; a load must be [layers, experts] with " +
                                   "1 <= layers <= " + std::to_string(kMaxLoadLayers) +
                                   " and 1 <= experts <= " + std::to_string(kMaxLoadExperts));
  }
  h5::Dims dims;
  ELDR_ASSIGN_OR_RETURN(std::vector<double> load, file.Read<double>(dataset, &dims, 2));
  const int E = static_cast<int>(dims[1]);
  for (size_t i = 0; i < load.size(); ++i) {
    ELDR_RETURN_IF_ERROR(CheckLoadValue(
        path + ": " + dataset + "[" + std::to_string(i / E) + ", " + std::to_string(i % E) + "]", load[i]));
  }
  ELDR_RETURN_IF_ERROR(CheckLoadTotal(path + ": " + dataset, load));
  *num_layers = static_cast<int>(dims[0]);
  *num_experts = E;
  return load;
}

}  // namespace eldr
