#include "runtime/calib/placement_store.h"

#include <algorithm>
#include <filesystem>

#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"

namespace eldr {

namespace {

constexpr const char* kRoot = "/placement";
constexpr const char* kGlobal = "/placement/global";

std::string ClusterGroup(int k) { return std::string(kRoot) + "/cluster_" + std::to_string(k); }

PlacementProblem ProblemOf(const Calibration& calib, const PlacementSpec& spec) {
  PlacementProblem p;
  p.num_layers = calib.shape.num_layers;
  p.num_experts = calib.shape.num_experts;
  p.num_slots = spec.num_slots;
  p.num_ranks = spec.num_ranks;
  p.num_nodes = spec.num_nodes;
  p.num_groups = spec.num_groups;
  return p;
}

Status WriteGroup(h5::File& f, const std::string& g, const Placement& pl, double balancedness) {
  const hsize_t L = pl.num_layers, E = pl.num_experts, P = pl.num_slots, R = pl.max_replicas;
  ELDR_RETURN_IF_ERROR(f.Write(g + "/phy2log", pl.phy2log, {L, P}));
  ELDR_RETURN_IF_ERROR(f.Write(g + "/log2phy", pl.log2phy, {L, E, R}));
  ELDR_RETURN_IF_ERROR(f.Write(g + "/logcnt", pl.logcnt, {L, E}));
  return f.WriteAttribute(g, "balancedness", balancedness);
}

Status WriteRoot(h5::File& f, const ClusterPlacements& p) {
  ELDR_RETURN_IF_ERROR(f.Remove(kRoot));
  ELDR_RETURN_IF_ERROR(f.CreateGroup(kRoot));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "algorithm", std::string(PlacementAlgorithmName(p.spec.algorithm))));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "num_slots", static_cast<int64_t>(p.spec.num_slots)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "num_ranks", static_cast<int64_t>(p.spec.num_ranks)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "num_nodes", static_cast<int64_t>(p.spec.num_nodes)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "num_groups", static_cast<int64_t>(p.spec.num_groups)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute(kRoot, "num_clusters", static_cast<int64_t>(p.per_cluster.size())));
  const size_t K = p.per_cluster.size();
  for (size_t k = 0; k < K; ++k) {
    ELDR_RETURN_IF_ERROR(WriteGroup(f, ClusterGroup(static_cast<int>(k)), p.per_cluster[k], p.balancedness[k]));
  }
  return WriteGroup(f, kGlobal, p.global, p.balancedness[K]);
}

// An optional integer attribute of /placement: `fallback` when absent, an error when present but unreadable.
Result<int64_t> OptionalInt(const h5::File& f, const char* name, int64_t fallback) {
  if (!f.HasAttribute(kRoot, name)) return fallback;
  return f.ReadIntAttribute(kRoot, name);
}

// Reads the header attributes into `out`.
Status ReadRoot(const h5::File& f, const std::string& path, int num_experts, StoredPlacements* out) {
  out->algorithm.clear();
  if (f.HasAttribute(kRoot, "algorithm")) {
    ELDR_ASSIGN_OR_RETURN(out->algorithm, f.ReadStringAttribute(kRoot, "algorithm"));
    if (!ParsePlacementAlgorithm(out->algorithm).ok()) {
      return Status::Corrupt(path + ": /placement has algorithm '" + out->algorithm.substr(0, 80) +
                             "', not one of deepseek-global, deepseek-hierarchical, eldr; re-run eldr place calib");
    }
  }
  if (!f.HasAttribute(kRoot, "num_ranks") || !f.HasAttribute(kRoot, "num_slots")) {
    return Status::Corrupt(path + ": /placement lacks its num_ranks or num_slots attribute; re-run eldr place calib");
  }
  ELDR_ASSIGN_OR_RETURN(const int64_t R, f.ReadIntAttribute(kRoot, "num_ranks"));
  ELDR_ASSIGN_OR_RETURN(const int64_t P, f.ReadIntAttribute(kRoot, "num_slots"));
  ELDR_ASSIGN_OR_RETURN(const int64_t nodes, OptionalInt(f, "num_nodes", 1));
  ELDR_ASSIGN_OR_RETURN(const int64_t groups, OptionalInt(f, "num_groups", 1));
  constexpr int64_t kMaxRanks = kMaxPlacementRanks, kMaxSlots = kMaxPlacementSlots, kMaxGroups = 65535;
  if (R < 1 || R > kMaxRanks || P < num_experts || P > kMaxSlots || nodes < 1 || nodes > kMaxRanks || groups < 1 ||
      groups > kMaxGroups) {
    return Status::Corrupt(path + ": /placement has num_ranks = " + std::to_string(R) +
                           ", num_slots = " + std::to_string(P) + ", num_nodes = " + std::to_string(nodes) +
                           ", num_groups = " + std::to_string(groups) + " (needs ranks and nodes in [1, " +
                           std::to_string(kMaxRanks) + "], groups in [1, " + std::to_string(kMaxGroups) +
                           "] and slots in [E = " + std::to_string(num_experts) + ", " + std::to_string(kMaxSlots) +
                           "]); re-run eldr place calib");
  }
  // The divisibility every placement has (placement.h): P % R, R % N and E % G.
  if (P % R != 0 || R % nodes != 0 || num_experts % groups != 0) {
    return Status::Corrupt(path + ": /placement has num_slots = " + std::to_string(P) +
                           ", num_ranks = " + std::to_string(R) + ", num_nodes = " + std::to_string(nodes) +
                           ", num_groups = " + std::to_string(groups) + " for E = " + std::to_string(num_experts) +
                           " experts, but a placement needs P % R = R % N = E % G = 0; re-run eldr place calib");
  }
  out->num_ranks = static_cast<int>(R);
  out->num_slots = static_cast<int>(P);
  out->num_nodes = static_cast<int>(nodes);
  out->num_groups = static_cast<int>(groups);
  // The clusters the placements were made for are this file's own /clusters (eldr place calib writes both):
  // another count means the /placement is left from another clustering.
  if (f.HasAttribute(kRoot, "num_clusters") && f.Exists("/clusters/sizes")) {
    ELDR_ASSIGN_OR_RETURN(const int64_t K, f.ReadIntAttribute(kRoot, "num_clusters"));
    ELDR_ASSIGN_OR_RETURN(const h5::Dims sizes, f.Shape("/clusters/sizes"));
    if (sizes.size() != 1 || static_cast<int64_t>(sizes[0]) != K) {
      return Status::Corrupt(path + ": /placement was made for num_clusters = " + std::to_string(K) +
                             " clusters but /clusters has " + (sizes.size() == 1 ? std::to_string(sizes[0]) : "?") +
                             "; re-run eldr place calib");
    }
  }
  return Status::Ok();
}

// /placement holds global and cluster_k for k < the file's cluster count (num_clusters, else the length of
// /clusters/sizes), each with a numeric balancedness in [0, 1] where it has one (other tools read it). Anything else
// is left from another tool or another clustering, and refused rather than passed over.
Status CheckMembers(const h5::File& f, const std::string& path) {
  int64_t K = -1;
  if (f.HasAttribute(kRoot, "num_clusters")) {
    ELDR_ASSIGN_OR_RETURN(K, f.ReadIntAttribute(kRoot, "num_clusters"));
  } else if (f.Exists("/clusters/sizes")) {
    ELDR_ASSIGN_OR_RETURN(const h5::Dims sizes, f.Shape("/clusters/sizes"));
    if (sizes.size() == 1) K = static_cast<int64_t>(sizes[0]);
  }
  ELDR_ASSIGN_OR_RETURN(const std::vector<std::string> members, f.Members(kRoot));
  for (const std::string& name : members) {
    bool known = name == "global";
    if (!known && name.rfind("cluster_", 0) == 0) {
      const std::string digits = name.substr(8);
      int64_t k = 0;
      known = !digits.empty() && digits.size() <= 9 && (digits.size() == 1 || digits[0] != '0') &&
              std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (known) k = std::stoll(digits);
      if (known && K >= 0 && k >= K) {
        return Status::Corrupt(path + ": /placement/" + name + " is beyond the file's " + std::to_string(K) +
                               " clusters (cluster_0..cluster_" + std::to_string(K - 1) + "); re-run eldr place calib");
      }
    }
    if (!known) {
      return Status::Corrupt(path + ": /placement has a member '" + name.substr(0, 80) +
                             "'; it holds only global and cluster_k groups; re-run eldr place calib");
    }
    const std::string g = std::string(kRoot) + "/" + name;
    if (f.HasAttribute(g, "balancedness")) {
      auto b = f.ReadDoubleAttribute(g, "balancedness");
      if (!b.ok()) return Status::Corrupt(path + ": " + g + "@balancedness is not a number; re-run eldr place calib");
      if (!(b.value() >= 0 && b.value() <= 1)) {
        return Status::Corrupt(path + ": " + g + "@balancedness = " + std::to_string(b.value()) +
                               ", outside [0, 1]; re-run eldr place calib");
      }
    }
  }
  return Status::Ok();
}

// logcnt and log2phy, where the file has them, must say what phy2log says (`pl`, rebuilt from it): readers use
// phy2log, but other tools read these, so a file whose copies contradict it is refused rather than passed on.
// log2phy [L, E, max_replicas] lists an expert's slots in any order (the DeepSeek variants write eplb.py's replica
// order), -1 padded.
Status CheckWrittenForOthers(const h5::File& f, const std::string& path, const std::string& g, const Placement& pl) {
  const int L = pl.num_layers, E = pl.num_experts;
  auto corrupt = [&](const std::string& what) {
    return Status::Corrupt(path + ": " + g + "/" + what + "; re-run eldr place calib");
  };
  h5::Dims dims;
  if (f.Exists(g + "/logcnt")) {
    ELDR_ASSIGN_OR_RETURN(std::vector<int32_t> logcnt, f.Read<int32_t>(g + "/logcnt", &dims, 2));
    if (dims[0] != static_cast<hsize_t>(L) || dims[1] != static_cast<hsize_t>(E)) {
      return corrupt("logcnt is [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) +
                     "], expected [L = " + std::to_string(L) + ", E = " + std::to_string(E) + "]");
    }
    for (size_t i = 0; i < logcnt.size(); ++i) {
      if (logcnt[i] != pl.logcnt[i]) {
        return corrupt("logcnt[" + std::to_string(i / E) + ", " + std::to_string(i % E) +
                       "] = " + std::to_string(logcnt[i]) + " but phy2log gives that expert " +
                       std::to_string(pl.logcnt[i]) + " slots");
      }
    }
  }
  if (!f.Exists(g + "/log2phy")) return Status::Ok();
  ELDR_ASSIGN_OR_RETURN(const h5::Dims shape, f.Shape(g + "/log2phy"));
  if (shape.size() != 3 || shape[0] != static_cast<hsize_t>(L) || shape[1] != static_cast<hsize_t>(E) ||
      shape[2] != static_cast<hsize_t>(pl.max_replicas)) {
    std::string got;
    for (hsize_t d : shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return corrupt("log2phy is [" + got + "], expected [L = " + std::to_string(L) + ", E = " + std::to_string(E) +
                   ", max replicas = " + std::to_string(pl.max_replicas) + "]");
  }
  ELDR_ASSIGN_OR_RETURN(std::vector<int32_t> log2phy, f.Read<int32_t>(g + "/log2phy", &dims, 3));
  const size_t width = dims[2];
  std::vector<int32_t> slots;
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) {
      const int32_t* row = log2phy.data() + (static_cast<size_t>(l) * E + e) * width;
      const int32_t* want = pl.log2phy.data() + (static_cast<size_t>(l) * E + e) * pl.max_replicas;
      const int cnt = pl.logcnt[static_cast<size_t>(l) * E + e];
      slots.assign(row, row + cnt);
      std::sort(slots.begin(), slots.end());  // `want` is ascending (PlacementFromPhy2Log)
      const bool padded = std::all_of(row + cnt, row + width, [](int32_t v) { return v == -1; });
      if (!padded || !std::equal(slots.begin(), slots.end(), want)) {
        // At most 8 entries of each list: a row is max_replicas long.
        auto list = [](const int32_t* v, size_t n) {
          std::string out;
          for (size_t k = 0; k < std::min<size_t>(n, 8); ++k) out += (k ? ", " : "") + std::to_string(v[k]);
          return n > 8 ? out + ", ... (" + std::to_string(n) + " in all)" : out;
        };
        const std::string listed = list(row, width), held = list(want, static_cast<size_t>(cnt));
        return corrupt("log2phy[" + std::to_string(l) + ", " + std::to_string(e) + "] = [" + listed +
                       "] but phy2log puts that expert in slots " + held + " (then -1 padding)");
      }
    }
  }
  return Status::Ok();
}

// One group's placement, rebuilt from its phy2log.
Result<Placement> ReadGroup(const h5::File& f, const std::string& path, const std::string& g, int L, int E,
                            const StoredPlacements& root) {
  h5::Dims dims;
  ELDR_ASSIGN_OR_RETURN(std::vector<int32_t> phy2log, f.Read<int32_t>(g + "/phy2log", &dims, 2));
  if (dims[0] != static_cast<hsize_t>(L) || dims[1] != static_cast<hsize_t>(root.num_slots)) {
    return Status::Corrupt(path + ": " + g + "/phy2log is [" + std::to_string(dims[0]) + ", " +
                           std::to_string(dims[1]) + "], expected [L = " + std::to_string(L) +
                           ", P = " + std::to_string(root.num_slots) + "]");
  }
  auto pl = PlacementFromPhy2Log(L, E, root.num_ranks, std::move(phy2log));
  if (!pl.ok()) return Status::Corrupt(path + ": " + g + "/phy2log: " + pl.status().message());
  ELDR_RETURN_IF_ERROR(CheckWrittenForOthers(f, path, g, pl.value()));
  return pl;
}

}  // namespace

std::vector<double> GlobalExpertLoad(const Calibration& calib) {
  const size_t row = static_cast<size_t>(calib.shape.num_layers) * calib.shape.num_experts;
  std::vector<double> global(row, 0.0);
  for (int k = 0; k < calib.num_clusters; ++k) {
    const float* load = calib.expert_load.data() + k * row;
    for (size_t x = 0; x < row; ++x) global[x] += static_cast<double>(load[x]) * static_cast<double>(calib.sizes[k]);
  }
  return global;
}

Result<ClusterPlacements> PlaceClusters(const Calibration& calib, const PlacementSpec& spec, const PlaceHooks* hooks) {
  const size_t row = static_cast<size_t>(calib.shape.num_layers) * calib.shape.num_experts;
  ClusterPlacements out;
  out.spec = spec;
  PlacementProblem p = ProblemOf(calib, spec);
  // The hooks of placement k count its layers after the k * L of the placements before it.
  int placed_before = 0;
  PlaceHooks each;
  if (hooks != nullptr) {
    each.check = hooks->check;
    if (hooks->on_layer) each.on_layer = [&](int done) { hooks->on_layer(placed_before + done); };
  }
  const PlaceHooks* each_hooks = hooks != nullptr ? &each : nullptr;
  for (int k = 0; k < calib.num_clusters; ++k) {
    p.load.assign(calib.expert_load.begin() + k * row, calib.expert_load.begin() + (k + 1) * row);
    ELDR_ASSIGN_OR_RETURN(Placement placed, Place(p, spec.algorithm, nullptr, each_hooks));
    out.balancedness.push_back(Balancedness(placed, p.load));
    out.per_cluster.push_back(std::move(placed));
    placed_before += calib.shape.num_layers;
  }
  p.load = GlobalExpertLoad(calib);
  ELDR_ASSIGN_OR_RETURN(out.global, Place(p, spec.algorithm, nullptr, each_hooks));
  out.balancedness.push_back(Balancedness(out.global, p.load));
  return out;
}

Status WritePlacements(const ClusterPlacements& placements, const std::string& calib_path,
                       const std::string& out_path) {
  AtomicOutput out(out_path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  std::error_code ec;
  std::filesystem::copy_file(calib_path, out.temp_path(), std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return Status::IoError(out_path + ": cannot write: " + ec.message());
  {
    ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadWrite(out.temp_path(), out_path));
    ELDR_RETURN_IF_ERROR(WriteRoot(f, placements));
    ELDR_RETURN_IF_ERROR(f.Close());
  }
  return out.Commit();
}

bool StoredPlacements::Matches(const PlacementSpec& spec) const {
  return present && num_ranks == spec.num_ranks && num_slots == spec.num_slots && num_nodes == spec.num_nodes &&
         num_groups == spec.num_groups && algorithm == PlacementAlgorithmName(spec.algorithm);
}

Result<StoredPlacements> ReadPlacements(const std::string& path, int num_layers, int num_experts, int cluster_begin,
                                        int cluster_end) {
  StoredPlacements out;
  ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadOnly(path));
  if (!f.Exists(kRoot)) return out;
  out.present = true;
  ELDR_RETURN_IF_ERROR(ReadRoot(f, path, num_experts, &out));
  ELDR_RETURN_IF_ERROR(CheckMembers(f, path));
  if (!f.Exists(std::string(kGlobal) + "/phy2log")) {
    return Status::Corrupt(path + ": /placement has no global/phy2log; re-run eldr place calib");
  }
  ELDR_ASSIGN_OR_RETURN(out.global, ReadGroup(f, path, kGlobal, num_layers, num_experts, out));
  for (int k = cluster_begin; k < cluster_end; ++k) {
    const std::string g = ClusterGroup(k);
    if (f.Exists(g) && !f.Exists(g + "/phy2log")) {
      return Status::Corrupt(path + ": " + g + " has no phy2log (a cluster without a placement has no " + g +
                             " at all, and uses global); re-run eldr place calib");
    }
    if (!f.Exists(g)) {  // the fallback rule
      out.from_global.push_back(k);
      out.per_cluster.push_back(out.global);
      continue;
    }
    ELDR_ASSIGN_OR_RETURN(Placement pl, ReadGroup(f, path, g, num_layers, num_experts, out));
    out.per_cluster.push_back(std::move(pl));
  }
  return out;
}

}  // namespace eldr
