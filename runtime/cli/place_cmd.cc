// eldr place: expert placement (EPLB and eldr's) for a load profile [L, E].
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include <filesystem>

#include "placement/placement.h"
#include "runtime/calib/calibration.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"
#include "runtime/cli/commands.h"
#include "runtime/common/json_util.h"

namespace eldr::cli {

namespace {

struct PlaceArgs {
  std::string load, dataset = "/load", algorithm = "eldr", previous, calib, out;
  int slots = 0, ranks = 0, nodes = 1, groups = 1;
  double move_slack = 0;
  int64_t expert_bytes = 0;
  bool as_json = false;
};

// One placement per decoder cluster from the per-cluster expert load of a calibration, plus the global one for
// comparison, written under /placement of a copy of the file that is renamed into place.
Status PlaceClusters(const PlaceArgs& a, PlacementAlgorithm algo) {
  ELDR_ASSIGN_OR_RETURN(Calibration c, ReadCalibration(a.calib));
  const int K = c.num_clusters, L = c.shape.num_layers, E = c.shape.num_experts;
  const size_t row = static_cast<size_t>(L) * E;
  const std::string out_path = a.out.empty() ? a.calib : a.out;
  AtomicOutput out(out_path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  std::vector<Placement> placements;
  std::vector<double> balancedness;
  std::vector<double> global(row, 0.0);
  for (int k = 0; k <= K; ++k) {
    PlacementProblem p;
    p.num_layers = L;
    p.num_experts = E;
    if (k < K) {
      p.load.assign(c.expert_load.begin() + k * row, c.expert_load.begin() + (k + 1) * row);
      for (size_t x = 0; x < row; ++x) global[x] += p.load[x] * static_cast<double>(c.sizes[k]);
    } else {
      p.load = global;  // k == K: every cluster's load together (the global placement)
    }
    p.num_slots = a.slots;
    p.num_ranks = a.ranks;
    p.num_nodes = a.nodes;
    p.num_groups = a.groups;
    auto placed = Place(p, algo);
    if (!placed.ok()) return placed.status().WithPrefix(a.calib);
    balancedness.push_back(Balancedness(placed.value(), p.load));
    placements.push_back(std::move(placed).value());
  }
  std::error_code ec;
  std::filesystem::copy_file(a.calib, out.temp_path(), std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return Status::IoError(out_path + ": cannot write: " + ec.message());
  {
    ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadWrite(out.temp_path(), out_path));
    ELDR_RETURN_IF_ERROR(f.Remove("/placement"));
    ELDR_RETURN_IF_ERROR(f.CreateGroup("/placement"));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/placement", "algorithm", std::string(PlacementAlgorithmName(algo))));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/placement", "num_slots", static_cast<int64_t>(a.slots)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/placement", "num_ranks", static_cast<int64_t>(a.ranks)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/placement", "num_nodes", static_cast<int64_t>(a.nodes)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/placement", "num_groups", static_cast<int64_t>(a.groups)));
    for (int k = 0; k <= K; ++k) {
      const Placement& pl = placements[k];
      const std::string g = k < K ? "/placement/cluster_" + std::to_string(k) : std::string("/placement/global");
      const hsize_t P = pl.num_slots, R = pl.max_replicas;
      ELDR_RETURN_IF_ERROR(f.Write(g + "/phy2log", pl.phy2log, {static_cast<hsize_t>(L), P}));
      ELDR_RETURN_IF_ERROR(f.Write(g + "/log2phy", pl.log2phy, {static_cast<hsize_t>(L), static_cast<hsize_t>(E), R}));
      ELDR_RETURN_IF_ERROR(f.Write(g + "/logcnt", pl.logcnt, {static_cast<hsize_t>(L), static_cast<hsize_t>(E)}));
      ELDR_RETURN_IF_ERROR(f.WriteAttribute(g, "balancedness", balancedness[k]));
    }
    ELDR_RETURN_IF_ERROR(f.Close());
  }
  ELDR_RETURN_IF_ERROR(out.Commit());
  nlohmann::json j = {{"algorithm", PlacementAlgorithmName(algo)}, {"out", out_path}, {"K", K}};
  std::vector<std::vector<std::string>> rows;
  for (int k = 0; k <= K; ++k) {
    j["balancedness"][k < K ? "cluster_" + std::to_string(k) : std::string("global")] = balancedness[k];
    rows.push_back({k < K ? "cluster " + std::to_string(k) : std::string("global (all clusters)"), Fmt(balancedness[k], 4)});
  }
  PrintResult(a.as_json,
              std::string("per-cluster placement (") + PlacementAlgorithmName(algo) + ") written to " + out_path +
                  " /placement\n" + FormatTable({"placement", "balancedness on its own load"}, rows),
              DumpJson(j));
  return Status::Ok();
}

}  // namespace

void AddPlaceCommand(CLI::App& app, Action* action) {
  using Args = PlaceArgs;
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "place", "Place experts (and redundant replicas) on expert-parallel ranks: deepseek-global, "
               "deepseek-hierarchical (the public EPLB algorithm) or eldr");
  cmd->add_option("--load", a->load,
                  "load [L, E]: a JSON expert-load profile ({\"token_scores\": {layer: {expert: share}}}) or HDF5");
  cmd->add_option("--calib", a->calib,
                  "per-cluster placement: one placement per decoder cluster from calibration.h5 /clusters/expert_load, "
                  "written under /placement");
  cmd->add_option("--out", a->out, "with --calib: the calibration file to write (default: update --calib in place)");
  cmd->add_option("--dataset", a->dataset, "HDF5 dataset holding the [L, E] load")->capture_default_str();
  cmd->add_option("--algorithm", a->algorithm, "deepseek-global, deepseek-hierarchical or eldr")->capture_default_str();
  cmd->add_option("--slots,-P", a->slots, "physical expert slots per layer (experts + redundant)")->required();
  cmd->add_option("--ranks,-R", a->ranks, "expert-parallel ranks")->required();
  cmd->add_option("--nodes,-N", a->nodes, "nodes")->capture_default_str();
  cmd->add_option("--groups,-G", a->groups, "expert groups (hierarchical packing)")->capture_default_str();
  cmd->add_option("--previous", a->previous, "JSON output of an earlier eldr place (its phy2log): minimise moves");
  cmd->add_option("--move-slack", a->move_slack, "eldr: bottleneck increase accepted to avoid moves (fraction)")
      ->capture_default_str();
  cmd->add_option("--expert-bytes", a->expert_bytes, "bytes of one expert's weights, to report moved bytes")
      ->capture_default_str();
  cmd->add_flag("--json", a->as_json, "print phy2log, log2phy, logcnt and balancedness as JSON");
  cmd->callback([=] {
    *action = [=]() -> Status {
      ELDR_ASSIGN_OR_RETURN(PlacementAlgorithm algo, ParsePlacementAlgorithm(a->algorithm));
      if (a->load.empty() == a->calib.empty()) {
        return Status::InvalidArgument("give exactly one of --load (a load profile) or --calib (per-cluster placement)");
      }
      if (!a->calib.empty()) return PlaceClusters(*a, algo);
      PlacementProblem p;
      const bool json = a->load.size() >= 5 && a->load.compare(a->load.size() - 5, 5, ".json") == 0;
      if (json) {
        ELDR_ASSIGN_OR_RETURN(p.load, ReadLoadJson(a->load, &p.num_layers, &p.num_experts));
      } else {
        ELDR_ASSIGN_OR_RETURN(p.load, ReadLoadHdf5(a->load, a->dataset, &p.num_layers, &p.num_experts));
      }
      p.num_slots = a->slots;
      p.num_ranks = a->ranks;
      p.num_nodes = a->nodes;
      p.num_groups = a->groups;
      p.move_slack = a->move_slack;
      std::unique_ptr<Placement> previous;
      if (!a->previous.empty()) {
        std::ifstream f(a->previous);
        if (!f) return Status::NotFound(a->previous + ": cannot open");
        nlohmann::json j;
        try {
          f >> j;
          ELDR_ASSIGN_OR_RETURN(Placement prev,
                                PlacementFromPhy2Log(j.at("num_layers"), j.at("num_experts"), j.at("num_ranks"),
                                                     j.at("phy2log").get<std::vector<int32_t>>()));
          previous = std::make_unique<Placement>(std::move(prev));
        } catch (const nlohmann::json::exception& e) {
          return Status::InvalidArgument(a->previous + ": not the JSON output of eldr place (" + e.what() + ")");
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      auto placed = Place(p, algo, previous.get());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!placed.ok()) return placed.status().WithPrefix(a->load);
      const Placement& pl = placed.value();
      const double balanced = Balancedness(pl, p.load);
      nlohmann::json j = {{"algorithm", PlacementAlgorithmName(algo)},
                          {"num_layers", pl.num_layers},
                          {"num_experts", pl.num_experts},
                          {"num_slots", pl.num_slots},
                          {"num_ranks", pl.num_ranks},
                          {"num_nodes", p.num_nodes},
                          {"num_groups", p.num_groups},
                          {"max_replicas", pl.max_replicas},
                          {"balancedness", balanced},
                          {"group_locality", GroupLocality(pl, p.load, p.num_groups, p.num_nodes)},
                          {"place_ms", ms},
                          {"phy2log", pl.phy2log},
                          {"log2phy", pl.log2phy},
                          {"logcnt", pl.logcnt}};
      std::string text = std::string("placement: ") + PlacementAlgorithmName(algo) + ", " +
                         std::to_string(pl.num_layers) + " layers x " + std::to_string(pl.num_experts) + " experts -> " +
                         std::to_string(pl.num_slots) + " slots on " + std::to_string(pl.num_ranks) + " ranks (" +
                         std::to_string(p.num_nodes) + " nodes), balancedness " + Fmt(balanced, 4) + ", " +
                         Fmt(ms, 2) + " ms\n";
      if (previous) {
        const MoveStats m = CountMoves(*previous, pl, a->expert_bytes);
        j["moved_experts"] = m.moved_experts;
        j["moved_bytes"] = m.moved_bytes;
        text += "moves from --previous: " + std::to_string(m.moved_experts) + " experts, " +
                std::to_string(m.moved_bytes) + " bytes\n";
      }
      PrintResult(a->as_json, text, DumpJson(j));
      return Status::Ok();
    };
  });
}

}  // namespace eldr::cli
