// eldr place: expert placement (EPLB and eldr's) for a load profile [L, E].
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "placement/placement.h"
#include "runtime/cli/commands.h"
#include "runtime/common/json_util.h"

namespace eldr::cli {

void AddPlaceCommand(CLI::App& app, Action* action) {
  struct Args {
    std::string load, dataset = "/load", algorithm = "eldr", previous;
    int slots = 0, ranks = 0, nodes = 1, groups = 1;
    double move_slack = 0;
    int64_t expert_bytes = 0;
    bool as_json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "place", "Place experts (and redundant replicas) on expert-parallel ranks: deepseek-global, "
               "deepseek-hierarchical (the public EPLB algorithm) or eldr");
  cmd->add_option("--load", a->load,
                  "load [L, E]: a JSON expert-load profile ({\"token_scores\": {layer: {expert: share}}}) or HDF5")
      ->required();
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
