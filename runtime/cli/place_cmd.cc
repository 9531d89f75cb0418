// eldr place: expert placement (EPLB and eldr's), as three subcommands:
//   profile   one placement for a load profile [L, E] (JSON or HDF5);
//   calib     one placement per decoder cluster of a calibration, written under its /placement
//             (runtime/calib/placement_store.h);
//   evaluate  the replay of a trace's decode steps through the contiguous, global and per-cluster placements
//             (runtime/eval/placement_replay.h).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>

#include "placement/placement.h"
#include "runtime/calib/calibration.h"
#include "runtime/calib/placement_store.h"
#include "runtime/cli/commands.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/eval/placement_replay.h"
#include "runtime/trace/trace.h"

namespace eldr::cli {

namespace {

// The EP group shape and algorithm, as given on the command line.
struct SpecArgs {
  std::string algorithm = "eldr";
  int slots = 0, ranks = 0, nodes = 1, groups = 1;
};

// Which of SpecArgs the command line set (evaluate takes the others from the stored /placement).
struct GivenSpec {
  bool slots = false, ranks = false, nodes = false, groups = false, algorithm = false;
};

// The bounds of -P (physical expert slots per layer, all ranks together), -R and -N (one EP group's ranks and
// nodes): placement.h's kMaxPlacementSlots and kMaxPlacementRanks. Place checks its memory; Ctrl-C stops it within
// a layer.
const IntRange kSlots = IntRange::Between(1, kMaxPlacementSlots);
const IntRange kRanks = IntRange::Between(1, kMaxPlacementRanks);
const IntRange kGroups = IntRange::Between(1, 65535);

// -P, -R, -N, -G and --algorithm. `required`: -P and -R must be given.
void AddSpecOptions(CLI::App* cmd, SpecArgs* s, bool required, const std::string& slots_help,
                    const std::string& ranks_help) {
  cmd->add_option("--algorithm", s->algorithm, "deepseek-global, deepseek-hierarchical or eldr")->capture_default_str();
  auto* slots = cmd->add_option("--slots,-P", s->slots, slots_help)->check(InRange(kSlots));
  auto* ranks = cmd->add_option("--ranks,-R", s->ranks, ranks_help)->check(InRange(kRanks));
  if (required) {
    slots->required();
    ranks->required();
  }
  cmd->add_option("--nodes,-N", s->nodes,
                  "nodes the ranks are spread over (deepseek-global places as if on one; they still set the reported "
                  "group_locality)")
      ->capture_default_str()
      ->check(InRange(kRanks));
  cmd->add_option("--groups,-G", s->groups,
                  "expert groups of E/G consecutive experts (deepseek-hierarchical packs them onto nodes, eldr "
                  "homes them; deepseek-global places as if G = 1, they still set the reported group_locality)")
      ->capture_default_str()
      ->check(InRange(kGroups));
}

// A progress bar over `total_layers` layers of placement (on a terminal) and Ctrl-C between layers (after
// InstallInterruptHandlers): the hooks of Place, PlaceClusters and PlaceForEvaluation.
class PlaceProgress {
 public:
  explicit PlaceProgress(int64_t total_layers) : bar_("placing layers", total_layers) {
    hooks_.check = [] { return Interrupted() ? InterruptStatus() : Status::Ok(); };
    hooks_.on_layer = [this](int done) { bar_.Update(done); };
  }
  PlaceProgress(const PlaceProgress&) = delete;
  PlaceProgress& operator=(const PlaceProgress&) = delete;
  const PlaceHooks* hooks() const { return &hooks_; }
  // Draws the bar full when the placement succeeded; otherwise it ends where it stands.
  void Finish(bool placed) {
    if (placed) bar_.Finish();
  }

 private:
  ProgressBar bar_;
  PlaceHooks hooks_;
};

GivenSpec GivenOf(const CLI::App* cmd) {
  return {cmd->count("--slots") > 0, cmd->count("--ranks") > 0, cmd->count("--nodes") > 0, cmd->count("--groups") > 0,
          cmd->count("--algorithm") > 0};
}

Result<PlacementSpec> SpecOf(const SpecArgs& s) {
  PlacementSpec spec;
  ELDR_ASSIGN_OR_RETURN(spec.algorithm, ParsePlacementAlgorithm(s.algorithm));
  spec.num_slots = s.slots;
  spec.num_ranks = s.ranks;
  spec.num_nodes = s.nodes;
  spec.num_groups = s.groups;
  return spec;
}

// ---- profile ----

struct ProfileArgs {
  std::string load, dataset, previous;  // dataset "": /load of an HDF5 load, token_scores of a JSON profile
  SpecArgs spec;
  double move_slack = 0;
  int64_t expert_bytes = 0;
  bool as_json = false;
};

Status ReadProfileLoad(const ProfileArgs& a, PlacementProblem* p) {
  const bool json = a.load.size() >= 5 && a.load.compare(a.load.size() - 5, 5, ".json") == 0;
  if (json) {
    const std::string member = a.dataset.empty() ? "token_scores" : a.dataset;
    ELDR_ASSIGN_OR_RETURN(p->load, ReadLoadJson(a.load, member, &p->num_layers, &p->num_experts));
  } else {
    const std::string dataset = a.dataset.empty() ? "/load" : a.dataset;
    ELDR_ASSIGN_OR_RETURN(p->load, ReadLoadHdf5(a.load, dataset, &p->num_layers, &p->num_experts));
  }
  return Status::Ok();
}

// The placement of an earlier `eldr place profile --json` (its phy2log).
Result<std::unique_ptr<Placement>> ReadPrevious(const std::string& path) {
  if (path.empty()) return std::unique_ptr<Placement>();
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, "an `eldr place profile --json` file"));
  std::ifstream f(path);
  if (!f) return Status::NotFound(path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto parsed = ParseJson(text);
  if (!parsed.ok()) return parsed.status().WithPrefix(path);
  try {
    const nlohmann::json& j = parsed.value();
    // Each entry an integer expert id as written (get<int32_t> would wrap 2^70 and truncate 1.5 silently).
    const nlohmann::json& entries = j.at("phy2log");
    if (!entries.is_array()) return Status::InvalidArgument(path + ": phy2log must be an array of expert ids");
    std::vector<int32_t> phy2log;
    phy2log.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const nlohmann::json& e = entries[i];
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
          (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))) {
        return Status::InvalidArgument(path + ": phy2log[" + std::to_string(i) + "] = " + e.dump().substr(0, 40) +
                                       " is not an expert id (a whole number >= 0)");
      }
      phy2log.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    auto prev = PlacementFromPhy2Log(j.at("num_layers"), j.at("num_experts"), j.at("num_ranks"), std::move(phy2log));
    if (!prev.ok()) return prev.status().WithPrefix(path);
    // num_slots is written beside phy2log [L, P]: a file where they disagree was edited and is not trusted.
    if (j.contains("num_slots") && j["num_slots"] != prev.value().num_slots) {
      return Status::InvalidArgument(path + ": num_slots = " + j["num_slots"].dump().substr(0, 40) +
                                     " but phy2log holds " + std::to_string(prev.value().num_slots) +
                                     " slots per layer");
    }
    // logcnt and log2phy are written beside phy2log too, and so is the algorithm's name: checked the same way.
    // log2phy lists each expert's slots in the algorithm's replica order (eplb's for the DeepSeek ones, ascending
    // for eldr), so it is compared as a set per expert.
    const Placement& pl = prev.value();
    const auto contradicts = [&path](const char* key) {
      return Status::InvalidArgument(path + ": " + key + " contradicts phy2log (the file was edited; re-run eldr " +
                                     "place profile --json, or drop " + key + ")");
    };
    if (j.contains("logcnt") && j["logcnt"] != pl.logcnt) return contradicts("logcnt");
    if (j.contains("log2phy")) {
      const nlohmann::json& file = j["log2phy"];
      if (!file.is_array() || file.size() != pl.log2phy.size()) return contradicts("log2phy");
      const size_t width = static_cast<size_t>(pl.max_replicas);
      std::vector<int64_t> given(width), derived(width);
      for (size_t row = 0; row < pl.log2phy.size(); row += width) {
        for (size_t r = 0; r < width; ++r) {
          if (!file[row + r].is_number_integer()) return contradicts("log2phy");
          given[r] = file[row + r].get<int64_t>();
          derived[r] = pl.log2phy[row + r];
        }
        std::sort(given.begin(), given.end());
        std::sort(derived.begin(), derived.end());
        if (given != derived) return contradicts("log2phy");
      }
    }
    if (j.contains("algorithm")) {
      if (!j["algorithm"].is_string() || !ParsePlacementAlgorithm(j["algorithm"].get<std::string>()).ok()) {
        return Status::InvalidArgument(path + ": algorithm = " + j["algorithm"].dump().substr(0, 40) +
                                       " is not a placement algorithm of eldr place profile");
      }
    }
    return std::make_unique<Placement>(std::move(prev).value());
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(path + ": not the JSON output of eldr place profile (" + JsonErrorText(e) + ")");
  }
}

nlohmann::json ProfileJson(const PlacementProblem& p, const Placement& pl, PlacementAlgorithm algo, double ms) {
  return {{"algorithm", PlacementAlgorithmName(algo)},
          {"num_layers", pl.num_layers},
          {"num_experts", pl.num_experts},
          {"num_slots", pl.num_slots},
          {"num_ranks", pl.num_ranks},
          {"num_nodes", p.num_nodes},
          {"num_groups", p.num_groups},
          {"max_replicas", pl.max_replicas},
          {"balancedness", Balancedness(pl, p.load)},
          {"group_locality", GroupLocality(pl, p.load, p.num_groups, p.num_nodes)},
          {"place_ms", ms},
          {"phy2log", pl.phy2log},
          {"log2phy", pl.log2phy},
          {"logcnt", pl.logcnt}};
}

std::string ProfileText(const PlacementProblem& p, const Placement& pl, PlacementAlgorithm algo, double ms) {
  return std::string("placement: ") + PlacementAlgorithmName(algo) + ", " + std::to_string(pl.num_layers) +
         " layers x " + std::to_string(pl.num_experts) + " experts -> " + std::to_string(pl.num_slots) + " slots on " +
         std::to_string(pl.num_ranks) + " ranks (" + std::to_string(p.num_nodes) + " nodes), balancedness " +
         Fmt(Balancedness(pl, p.load), 4) + ", " + Fmt(ms, 2) + " ms\n";
}

Status RunProfile(const ProfileArgs& a, const CLI::App& cmd) {
  ELDR_ASSIGN_OR_RETURN(PlacementSpec spec, SpecOf(a.spec));
  // Options that only a re-plan reads are refused without one (they would be ignored).
  for (const char* name : {"--move-slack", "--expert-bytes"}) {
    if (cmd.count(name) > 0 && a.previous.empty()) {
      return Status::InvalidArgument(std::string(name) +
                                     " applies to a re-plan only: give --previous (an earlier `eldr place profile "
                                     "--json` output) or drop it");
    }
  }
  if (cmd.count("--move-slack") > 0 && spec.algorithm != PlacementAlgorithm::kEldr) {
    return Status::InvalidArgument(std::string("--move-slack does not apply to ") +
                                   PlacementAlgorithmName(spec.algorithm) +
                                   ", which follows the public algorithm and ignores --previous (its moves are still "
                                   "counted); drop it or use --algorithm eldr");
  }
  PlacementProblem p;
  ELDR_RETURN_IF_ERROR(ReadProfileLoad(a, &p));
  p.num_slots = spec.num_slots;
  p.num_ranks = spec.num_ranks;
  p.num_nodes = spec.num_nodes;
  p.num_groups = spec.num_groups;
  p.move_slack = a.move_slack;
  ELDR_ASSIGN_OR_RETURN(std::unique_ptr<Placement> previous, ReadPrevious(a.previous));
  InstallInterruptHandlers();  // the placement polls Ctrl-C (the reads above end by the default action)
  PlaceProgress progress(p.num_layers);
  const auto t0 = std::chrono::steady_clock::now();
  auto placed = Place(p, spec.algorithm, previous.get(), progress.hooks());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  progress.Finish(placed.ok());
  if (Interrupted()) return InterruptStatus();
  if (!placed.ok()) return placed.status().WithPrefix(a.load + (previous ? " with --previous " + a.previous : ""));
  const Placement& pl = placed.value();
  std::optional<MoveStats> moves;
  if (previous) moves = CountMoves(*previous, pl, a.expert_bytes);
  // The JSON holds log2phy [L, E, max_replicas] too: built only when asked for, and checked first (a value of the JSON
  // tree and its text take about 64 bytes, against 4 in the placement).
  if (a.as_json) {
    const double values = static_cast<double>(pl.phy2log.size() + pl.log2phy.size() + pl.logcnt.size());
    ELDR_RETURN_IF_ERROR(CheckMemoryBudget(
        64.0 * values, "the --json output (phy2log, log2phy and logcnt: " + Fmt(values, 0) + " values)"));
    nlohmann::json j = ProfileJson(p, pl, spec.algorithm, ms);
    if (moves) {
      j["moved_experts"] = moves->moved_experts;
      j["moved_bytes"] = moves->moved_bytes;
    }
    PrintResult(true, "", DumpJson(WithProvenance(j, cmd)));
    return Status::Ok();
  }
  std::string text = ProfileText(p, pl, spec.algorithm, ms);
  if (moves) {
    text += "moves from --previous: " + std::to_string(moves->moved_experts) + " experts, " +
            FormatBytes(moves->moved_bytes) + "\n";
  }
  PrintResult(false, text, "");
  return Status::Ok();
}

void AddProfileCommand(CLI::App* place, Action* action) {
  auto a = std::make_shared<ProfileArgs>();
  auto* cmd = place->add_subcommand("profile", "One placement for an expert-load profile [L, E] (JSON or HDF5)");
  cmd->add_option("--load", a->load,
                  "load [L, E]: a JSON expert-load profile ({\"token_scores\": {layer: {expert: share}}}) or HDF5")
      ->required()
      ->check(NonEmptyPath());
  cmd->add_option("--dataset", a->dataset,
                  "the [L, E] load inside --load: an HDF5 dataset (default /load), or a JSON profile's member, "
                  "token_scores (default) or gate_scores")
      ->check(NonEmpty("the dataset is empty; give one such as /load (HDF5) or gate_scores (JSON)"));
  AddSpecOptions(cmd, &a->spec, true, "physical expert slots per layer (experts + redundant)", "expert-parallel ranks");
  cmd->add_option("--previous", a->previous,
                  "JSON output of an earlier eldr place profile (its phy2log): minimise moves")
      ->check(NonEmptyPath());
  cmd->add_option("--move-slack", a->move_slack, "eldr: bottleneck increase accepted to avoid moves (fraction)")
      ->capture_default_str()
      ->check(InRange(NumberRange::AtLeast(0)));
  cmd->add_option("--expert-bytes", a->expert_bytes, "bytes of one expert's weights, to report moved bytes")
      ->capture_default_str()
      ->check(InRange(IntRange::AtLeast(0)));
  cmd->add_flag("--json", a->as_json, "print phy2log, log2phy, logcnt and balancedness as JSON");
  cmd->callback([=] { *action = [=] { return RunProfile(*a, *cmd); }; });
}

// ---- calib ----

struct CalibArgs {
  std::string calib, out;
  SpecArgs spec;
  bool as_json = false;
};

void PrintClusterPlacements(const CalibArgs& a, const ClusterPlacements& p, const std::string& out_path,
                            const CLI::App& cmd) {
  const int K = static_cast<int>(p.per_cluster.size());
  const char* algo = PlacementAlgorithmName(p.spec.algorithm);
  nlohmann::json j = {{"algorithm", algo}, {"out", out_path}, {"K", K}};
  std::vector<std::vector<std::string>> rows;
  for (int k = 0; k <= K; ++k) {
    const std::string name = k < K ? "cluster_" + std::to_string(k) : std::string("global");
    j["balancedness"][name] = p.balancedness[k];
    rows.push_back(
        {k < K ? "cluster " + std::to_string(k) : std::string("global (all clusters)"), Fmt(p.balancedness[k], 4)});
  }
  PrintResult(a.as_json,
              std::string("per-cluster placement (") + algo + ") written to " + out_path + " /placement\n" +
                  FormatTable({"placement", "balancedness on its own load"}, rows),
              DumpJson(WithProvenance(j, cmd)));
}

Status RunCalib(const CalibArgs& a, const CLI::App& cmd) {
  ELDR_ASSIGN_OR_RETURN(PlacementSpec spec, SpecOf(a.spec));
  const std::string out_path = a.out.empty() ? a.calib : a.out;
  InstallInterruptHandlers();
  ELDR_RETURN_IF_ERROR(AtomicOutput(out_path).CheckWritable());
  ELDR_ASSIGN_OR_RETURN(Calibration calib, ReadCalibration(a.calib));
  PlaceProgress progress(static_cast<int64_t>(calib.num_clusters + 1) * calib.shape.num_layers);
  auto placed = PlaceClusters(calib, spec, progress.hooks());
  progress.Finish(placed.ok());
  if (Interrupted()) return InterruptStatus().WithPrefix(out_path);
  if (!placed.ok()) return placed.status().WithPrefix(a.calib);
  ELDR_RETURN_IF_ERROR(WritePlacements(placed.value(), a.calib, out_path));
  PrintClusterPlacements(a, placed.value(), out_path, cmd);
  return Status::Ok();
}

void AddCalibCommand(CLI::App* place, Action* action) {
  auto a = std::make_shared<CalibArgs>();
  auto* cmd = place->add_subcommand(
      "calib",
      "One placement per decoder cluster of a calibration (/clusters/expert_load) and the global one, "
      "written under its /placement");
  cmd->add_option("--calib", a->calib, "calibration.h5")->required()->check(NonEmptyPath());
  cmd->add_option("--out", a->out, "the calibration file to write (default: update --calib in place)")
      ->check(NonEmptyPath());
  AddSpecOptions(cmd, &a->spec, true, "physical expert slots per layer (experts + redundant)", "expert-parallel ranks");
  cmd->add_flag("--json", a->as_json, "print each placement's balancedness as JSON");
  cmd->footer(
      "/placement: attributes algorithm, num_ranks, num_slots, num_nodes, num_groups, num_clusters; groups "
      "cluster_<k> (from /clusters/expert_load[k]) and global (from sum_k sizes[k] * expert_load[k]), each with "
      "phy2log [L, P], log2phy [L, E, max_replicas], logcnt [L, E] and attribute balancedness. eldr serve's "
      "decode.placement and eldr place evaluate read them: cluster k uses cluster_<k> when present, else global.");
  cmd->callback([=] { *action = [=] { return RunCalib(*a, *cmd); }; });
}

// ---- evaluate ----

// Decode tokens per replayed step (--batch): far beyond any decode batch, and a step fits in memory.
constexpr IntRange kEvaluateBatch{1, 1 << 20};

struct EvaluateArgs {
  std::string calib, trace, out;
  SpecArgs spec;
  int batch = 16;
  bool holdout_from_calib = false, as_json = false;
};

// The spec to evaluate: options given on the command line, the others from the stored /placement, else the
// defaults (P = E; the default algorithm when the file does not record one, so that it is placed now).
Result<PlacementSpec> ResolveSpec(const EvaluateArgs& a, const GivenSpec& given, const StoredPlacements& stored,
                                  const Calibration& calib) {
  SpecArgs s = a.spec;
  if (!given.ranks && !stored.present) {
    return Status::InvalidArgument(a.calib +
                                   " has no /placement to take the rank count from: give --ranks (and --slots)");
  }
  if (!given.ranks) s.ranks = stored.num_ranks;
  if (s.ranks < 1) return Status::InvalidArgument("--ranks must be >= 1, got " + std::to_string(s.ranks));
  const bool stored_ranks = stored.present && stored.num_ranks == s.ranks;
  if (!given.slots) s.slots = stored_ranks ? stored.num_slots : calib.shape.num_experts;
  if (!given.nodes && stored.present) s.nodes = stored.num_nodes;
  if (!given.groups && stored.present) s.groups = stored.num_groups;
  if (!given.algorithm && stored.present && !stored.algorithm.empty()) s.algorithm = stored.algorithm;
  auto spec = SpecOf(s);
  if (!spec.ok() && !given.algorithm && stored.present) return spec.status().WithPrefix(a.calib + " /placement");
  return spec;
}

// The stored placements when they were written for `spec`, else placed now.
Result<ComparedPlacements> LoadComparedPlacements(const EvaluateArgs& a, const PlacementSpec& spec,
                                                  const Calibration& calib, StoredPlacements stored) {
  if (!stored.Matches(spec)) {
    PlaceProgress progress(static_cast<int64_t>(calib.num_clusters + 1) * calib.shape.num_layers);
    auto placed = PlaceForEvaluation(calib, spec, a.calib, progress.hooks());
    progress.Finish(placed.ok());
    if (Interrupted()) return InterruptStatus();
    return placed;
  }
  ComparedPlacements out;
  auto contiguous = ContiguousPlacement(calib.shape.num_layers, calib.shape.num_experts, spec.num_ranks);
  if (!contiguous.ok()) return contiguous.status().WithPrefix(a.calib);
  out.contiguous = std::move(contiguous).value();
  out.global = std::move(stored.global);
  out.per_cluster = std::move(stored.per_cluster);
  out.source = stored.algorithm + ", read from " + a.calib + " /placement";
  if (!stored.from_global.empty()) {
    std::string clusters;
    for (int k : stored.from_global) clusters += (clusters.empty() ? "" : ", ") + std::to_string(k);
    out.source += " (no cluster_k for cluster " + clusters + ": global used)";
  }
  return out;
}

Status RunEvaluate(const EvaluateArgs& a, const GivenSpec& given, const CLI::App& cmd) {
  ELDR_RETURN_IF_ERROR(CheckOutputs({{a.out, "--out"}}, {{a.trace, "--trace"}, {a.calib, "--calib"}}));
  ELDR_ASSIGN_OR_RETURN(Calibration calib, ReadCalibration(a.calib));
  ELDR_ASSIGN_OR_RETURN(Trace trace, ReadTrace(a.trace));
  if (!trace.shape.SameAs(calib.shape)) {
    return Status::FailedPrecondition(a.trace + ": model shape " + trace.shape.ToString() + " differs from " + a.calib +
                                      " (" + calib.shape.ToString() + ")");
  }
  ELDR_ASSIGN_OR_RETURN(StoredPlacements stored, ReadPlacements(a.calib, calib.shape.num_layers,
                                                                calib.shape.num_experts, 0, calib.num_clusters));
  ELDR_ASSIGN_OR_RETURN(PlacementSpec spec, ResolveSpec(a, given, stored, calib));
  // From here on the placement and the replay poll Ctrl-C (the reads above end it by the default action).
  InstallInterruptHandlers();
  ELDR_ASSIGN_OR_RETURN(ComparedPlacements placements, LoadComparedPlacements(a, spec, calib, std::move(stored)));
  PlacementReplayOptions o;
  o.batch_size = a.batch;
  o.holdout_only = a.holdout_from_calib;
  auto replayed = ReplayPlacements(trace, calib, placements, o, a.trace, a.calib);
  if (Interrupted()) return InterruptStatus();
  ELDR_ASSIGN_OR_RETURN(PlacementReplayReport rep, std::move(replayed));
  const nlohmann::json j = WithProvenance(rep.ToJson(), cmd);
  if (!a.out.empty()) ELDR_RETURN_IF_ERROR(WriteJsonFile(a.out, j));
  PrintResult(a.as_json, rep.ToText() + (a.out.empty() ? "" : "report written to " + a.out + "\n"), DumpJson(j));
  return Status::Ok();
}

void AddEvaluateCommand(CLI::App* place, Action* action) {
  auto a = std::make_shared<EvaluateArgs>();
  auto* cmd = place->add_subcommand(
      "evaluate",
      "Replay the decode steps of a trace through the contiguous, global and per-cluster placements of "
      "a calibration and report per-step balancedness (mean, p1) and max-rank load");
  cmd->add_option("--trace", a->trace, "HDF5 routing trace whose decode steps are replayed")
      ->required()
      ->check(NonEmptyPath());
  cmd->add_option("--calib", a->calib, "calibration.h5, with or without /placement")->required()->check(NonEmptyPath());
  cmd->add_option("--out", a->out, "also write the JSON report here")->check(NonEmptyPath());
  cmd->add_flag("--holdout-from-calib", a->holdout_from_calib,
                "only the requests of --trace that are not calibration members (on the calibrated trace: the ones "
                "eldr calibrate --holdout kept out)");
  cmd->add_option("--batch", a->batch, "decode tokens per step")->capture_default_str()->check(InRange(kEvaluateBatch));
  AddSpecOptions(cmd, &a->spec, false, "physical expert slots per layer (default: the stored /placement's, else E)",
                 "expert-parallel ranks (default: the stored /placement's)");
  cmd->add_flag("--json", a->as_json, "print the report as JSON");
  cmd->footer(
      "Each usable request of --trace (prompt and decode tokens; with --holdout-from-calib only those whose id is "
      "not in the calibration's /calibration/request_ids) goes to the cluster of its nearest centroid "
      "(locality_top1: its prompt signature, tau = 0). A cluster's decode tokens are interleaved round-robin over its "
      "requests (token 0 of each, then token 1, ...) and cut into steps of --batch tokens (a final shorter step is "
      "dropped unless it is the only one). Per step and MoE layer, a rank's load is the number of (token, expert) "
      "activations of the experts it holds, a replicated expert's split evenly over its replicas; balancedness = "
      "sum over layers of mean rank load / sum over layers of max rank load (DESIGN.md section 3), max-rank load = "
      "sum over layers of max rank load / L. Placements: contiguous (expert e on rank e / (E/R), P = E), global "
      "(all clusters' load) and per-cluster (/clusters/expert_load[k]); global and per-cluster are read from "
      "/placement when it was written for the same R, P, N, G and algorithm (cluster k: cluster_<k>, else global, "
      "as eldr serve does), else placed now. Reported per cluster and over all steps: mean and p1 (1st percentile) "
      "balancedness and mean max-rank load.");
  cmd->callback([=] {
    const GivenSpec given = GivenOf(cmd);
    *action = [=] { return RunEvaluate(*a, given, *cmd); };
  });
}

}  // namespace

void AddPlaceCommand(CLI::App& app, Action* action) {
  auto* cmd = app.add_subcommand("place",
                                 "Place experts (and redundant replicas) on expert-parallel ranks: deepseek-global, "
                                 "deepseek-hierarchical (the public EPLB algorithm) or eldr");
  cmd->require_subcommand(1);
  AddProfileCommand(cmd, action);
  AddCalibCommand(cmd, action);
  AddEvaluateCommand(cmd, action);
  cmd->footer(
      "eldr place profile --load L.json -P 160 -R 32 ...   one placement for a load profile\n"
      "eldr place calib --calib calib.h5 -P 80 -R 8        per-cluster placements into calib.h5 /placement\n"
      "eldr place evaluate --trace t.h5 --calib calib.h5   replay decode steps through them\n"
      "(before eldr 0.2 these were eldr place --load / --calib / --evaluate)");
}

}  // namespace eldr::cli
