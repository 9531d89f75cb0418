// eldr place: expert placement (EPLB and eldr's) for a load profile [L, E], per decoder cluster of a calibration
// (--calib), and the replay of a trace's decode steps through those placements (--evaluate).
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
#include "runtime/common/signals.h"
#include "runtime/router/placement_replay.h"
#include "runtime/trace/trace.h"

namespace eldr::cli {

namespace {

struct PlaceArgs {
  std::string load, dataset = "/load", algorithm = "eldr", previous, calib, out, trace;
  int slots = 0, ranks = 0, nodes = 1, groups = 1;
  double move_slack = 0;
  int64_t expert_bytes = 0;
  bool as_json = false;
  bool evaluate = false, holdout_from_calib = false;
  int batch = 16;
};

// Which of the placement options the command line set (the others may come from /placement of the calibration).
struct GivenOptions {
  bool slots = false, ranks = false, nodes = false, groups = false, algorithm = false;
};

// eldr place --evaluate (runtime/router/placement_replay.h describes the replay). Global and per-cluster
// placements come from /placement of the calibration when it holds them for the requested R, P, N, G and
// algorithm (options not given take the stored values); otherwise they are placed now from /clusters/expert_load.
Status Evaluate(const PlaceArgs& a, const GivenOptions& given) {
  if (a.trace.empty() || a.calib.empty()) {
    return Status::InvalidArgument("--evaluate needs --trace (an HDF5 routing trace) and --calib (calibration.h5)");
  }
  if (!a.load.empty()) return Status::InvalidArgument("--evaluate takes its load from --calib, not --load");
  if (!a.previous.empty()) return Status::InvalidArgument("--previous does not apply to --evaluate");
  if (a.batch < 1) return Status::InvalidArgument("--batch must be >= 1, got " + std::to_string(a.batch));
  ELDR_RETURN_IF_ERROR(CheckOutputs({{a.out, "--out"}}, {{a.trace, "--trace"}, {a.calib, "--calib"}}));
  ELDR_ASSIGN_OR_RETURN(Calibration calib, ReadCalibration(a.calib));
  ELDR_ASSIGN_OR_RETURN(Trace trace, ReadTrace(a.trace));
  if (!trace.shape.SameAs(calib.shape)) {
    return Status::FailedPrecondition(a.trace + ": model shape " + trace.shape.ToString() + " differs from " + a.calib +
                                      " (" + calib.shape.ToString() + ")");
  }
  ELDR_ASSIGN_OR_RETURN(StoredPlacements stored, ReadStoredPlacements(a.calib, calib));
  PlacementSpec spec;
  if (given.ranks) {
    spec.num_ranks = a.ranks;
  } else if (stored.present) {
    spec.num_ranks = stored.num_ranks;
  } else {
    return Status::InvalidArgument(a.calib +
                                   " has no /placement to take the rank count from: give --ranks (and --slots)");
  }
  if (spec.num_ranks < 1) return Status::InvalidArgument("--ranks must be >= 1, got " + std::to_string(spec.num_ranks));
  const bool stored_ranks = stored.present && stored.num_ranks == spec.num_ranks;
  spec.num_slots = given.slots ? a.slots : stored_ranks ? stored.num_slots : calib.shape.num_experts;
  spec.num_nodes = given.nodes || !stored.present ? a.nodes : stored.num_nodes;
  spec.num_groups = given.groups || !stored.present ? a.groups : stored.num_groups;
  std::string algorithm = given.algorithm || !stored.present ? a.algorithm : stored.algorithm;
  auto algo = ParsePlacementAlgorithm(algorithm);
  if (!algo.ok()) {
    return given.algorithm || !stored.present ? algo.status() : algo.status().WithPrefix(a.calib + " /placement");
  }
  spec.algorithm = algo.value();
  ComparedPlacements placements;
  if (stored_ranks && stored.num_slots == spec.num_slots && stored.num_nodes == spec.num_nodes &&
      stored.num_groups == spec.num_groups && stored.algorithm == algorithm) {
    auto contiguous = ContiguousPlacement(calib.shape.num_layers, calib.shape.num_experts, spec.num_ranks);
    if (!contiguous.ok()) return contiguous.status().WithPrefix(a.calib);
    placements.contiguous = std::move(contiguous).value();
    placements.global = std::move(stored.global);
    placements.per_cluster = std::move(stored.per_cluster);
    placements.source = algorithm + ", read from " + a.calib + " /placement";
  } else {
    ELDR_ASSIGN_OR_RETURN(placements, PlaceForEvaluation(calib, spec, a.calib));
  }
  PlacementReplayOptions o;
  o.batch_size = a.batch;
  o.holdout_only = a.holdout_from_calib;
  ELDR_ASSIGN_OR_RETURN(PlacementReplayReport rep, ReplayPlacements(trace, calib, placements, o, a.trace, a.calib));
  const nlohmann::json j = rep.ToJson();
  if (!a.out.empty()) ELDR_RETURN_IF_ERROR(WriteJsonFile(a.out, j));
  PrintResult(a.as_json, rep.ToText() + (a.out.empty() ? "" : "report written to " + a.out + "\n"), DumpJson(j));
  return Status::Ok();
}

// One placement per decoder cluster from the per-cluster expert load of a calibration, plus the global one for
// comparison, written under /placement of a copy of the file that is renamed into place.
Status PlaceClusters(const PlaceArgs& a, PlacementAlgorithm algo) {
  InstallInterruptHandlers();
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
  cmd->add_option("--out", a->out,
                  "with --calib: the calibration file to write (default: update --calib in place); with --evaluate: "
                  "the JSON report");
  cmd->add_flag("--evaluate", a->evaluate,
                "replay the decode steps of --trace through the contiguous, global and per-cluster placements of "
                "--calib and report per-step balancedness (mean, p1) and max-rank load (see below)");
  cmd->add_option("--trace", a->trace, "with --evaluate: HDF5 routing trace whose decode steps are replayed");
  cmd->add_flag("--holdout-from-calib", a->holdout_from_calib,
                "with --evaluate: only the requests of --trace that are not calibration members (on the calibrated "
                "trace: the ones eldr calibrate --holdout kept out)");
  cmd->add_option("--batch", a->batch, "with --evaluate: decode tokens per step")->capture_default_str();
  cmd->add_option("--dataset", a->dataset, "HDF5 dataset holding the [L, E] load")->capture_default_str();
  cmd->add_option("--algorithm", a->algorithm, "deepseek-global, deepseek-hierarchical or eldr")->capture_default_str();
  cmd->add_option("--slots,-P", a->slots,
                  "physical expert slots per layer (experts + redundant); required except with --evaluate (default "
                  "there: the stored /placement's, else E)");
  cmd->add_option("--ranks,-R", a->ranks,
                  "expert-parallel ranks; required except with --evaluate (default there: the stored /placement's)");
  cmd->add_option("--nodes,-N", a->nodes, "nodes")->capture_default_str();
  cmd->add_option("--groups,-G", a->groups, "expert groups (hierarchical packing)")->capture_default_str();
  cmd->add_option("--previous", a->previous, "JSON output of an earlier eldr place (its phy2log): minimise moves");
  cmd->add_option("--move-slack", a->move_slack, "eldr: bottleneck increase accepted to avoid moves (fraction)")
      ->capture_default_str();
  cmd->add_option("--expert-bytes", a->expert_bytes, "bytes of one expert's weights, to report moved bytes")
      ->capture_default_str();
  cmd->add_flag("--json", a->as_json, "print phy2log, log2phy, logcnt and balancedness as JSON");
  cmd->footer(
      "--evaluate: each usable request of --trace (prompt and decode tokens; with --holdout-from-calib only those "
      "whose id is not in the calibration's /calibration/request_ids) goes to the cluster of its nearest centroid "
      "(locality_top1: its prompt signature, tau = 0). A cluster's decode tokens are interleaved round-robin over its "
      "requests (token 0 of each, then token 1, ...) and cut into steps of --batch tokens (a final shorter step is "
      "dropped unless it is the only one). Per step and MoE layer, a rank's load is the number of (token, expert) "
      "activations of the experts it holds, a replicated expert's split evenly over its replicas; balancedness = "
      "sum over layers of mean rank load / sum over layers of max rank load (DESIGN.md section 3), max-rank load = "
      "sum over layers of max rank load / L. Placements: contiguous (expert e on rank e / (E/R), P = E), global "
      "(all clusters' load) and per-cluster (/clusters/expert_load[k]); global and per-cluster are read from "
      "/placement when it was written for the same R, P, N, G and algorithm, else placed now. Reported per cluster "
      "and over all steps: mean and p1 (1st percentile) balancedness and mean max-rank load.");
  cmd->callback([=] {
    const GivenOptions given{cmd->count("--slots") > 0, cmd->count("--ranks") > 0, cmd->count("--nodes") > 0,
                             cmd->count("--groups") > 0, cmd->count("--algorithm") > 0};
    *action = [=]() -> Status {
      if (a->evaluate) return Evaluate(*a, given);
      if (!a->trace.empty()) return Status::InvalidArgument("--trace is for --evaluate");
      ELDR_ASSIGN_OR_RETURN(PlacementAlgorithm algo, ParsePlacementAlgorithm(a->algorithm));
      if (a->load.empty() == a->calib.empty()) {
        return Status::InvalidArgument("give exactly one of --load (a load profile) or --calib (per-cluster placement)");
      }
      if (!given.slots || !given.ranks) {
        return Status::InvalidArgument("--slots (-P) and --ranks (-R) are required");
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
          auto prev = PlacementFromPhy2Log(j.at("num_layers"), j.at("num_experts"), j.at("num_ranks"),
                                           j.at("phy2log").get<std::vector<int32_t>>());
          if (!prev.ok()) return prev.status().WithPrefix(a->previous);
          previous = std::make_unique<Placement>(std::move(prev).value());
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
