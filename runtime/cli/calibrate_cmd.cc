// eldr calibrate (fit or --refit) and eldr inspect.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "runtime/calib/calibrate.h"
#include "runtime/calib/calibration.h"
#include "runtime/calib/placement_store.h"
#include "runtime/cli/commands.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"
#include "runtime/common/json_util.h"
#include "runtime/common/signals.h"

namespace eldr::cli {

namespace {

struct CalibrateArgs {
  std::string trace;
  std::string refit;
  std::string out;
  std::string variant = "count_idf";
  std::string layers = "auto";
  std::string report;
  std::string features = "prefill";
  CalibrateOptions options;
  std::string balance;
  bool balance_given = false;  // otherwise work for a fit, the stored balance for --refit
  bool tau_given = false;
  bool as_json = false;
  bool quiet = false;
  std::vector<std::string> fit_only_given;  // fit options on the command line (--signature, --layers, --holdout, ...)
};

Status RunCalibrate(const CalibrateArgs& a) {
  CalibrateOptions o = a.options;
  if (a.balance_given) {
    auto parsed = ParseClusterBalance(a.balance);
    if (!parsed.ok()) return parsed.status().WithPrefix("--balance");
    o.balance = parsed.value();
  }
  CalibrateReport report;
  Calibration calib;
  if (a.trace.empty() == a.refit.empty()) {
    return Status::InvalidArgument("give exactly one of --trace (fit) or --refit CALIBRATION (re-cluster)");
  }
  // Outputs are checked before any work, so a bad path fails in a second, not after the fit; the calibration and
  // the report are committed together or not at all.
  InstallInterruptHandlers();
  OutputSet outputs;
  AtomicOutput& calib_out = outputs.Add(a.out, "--out");
  AtomicOutput* report_out = a.report.empty() ? nullptr : &outputs.Add(a.report, "--report");
  ELDR_RETURN_IF_ERROR(outputs.CheckWritable({{a.trace, "--trace"}, {a.refit, "--refit"}}));
  if (!a.refit.empty() && !a.fit_only_given.empty()) {
    return Status::InvalidArgument(a.fit_only_given[0] +
                                   " is a fit option: --refit re-clusters the stored signatures (their variant, "
                                   "layer mask and rho); fit again with --trace to change it");
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  double seconds_read = 0;
  if (!a.refit.empty()) {
    const auto t0 = Clock::now();
    ELDR_ASSIGN_OR_RETURN(Calibration old, ReadCalibration(a.refit));
    seconds_read = seconds_since(t0);
    const ClusterBalance balance = a.balance_given ? o.balance : old.balance;  // keep the stored one by default
    auto r = Refit(old, o.num_decoders, o.seed, o.restarts, balance, o.progress, &report);
    if (!r.ok()) return Interrupted() ? InterruptStatus().WithPrefix(a.out) : r.status().WithPrefix(a.refit);
    calib = std::move(r).value();
    if (a.tau_given) calib.tau = o.tau;  // otherwise keep the stored τ
    if (!(calib.tau >= 0) || !std::isfinite(calib.tau))
      return Status::InvalidArgument("--tau must be a finite value >= 0");
  } else {
    ELDR_ASSIGN_OR_RETURN(o.variant, ParseSignatureVariant(a.variant));
    ELDR_ASSIGN_OR_RETURN(o.features, ParseSignatureFeatures(a.features));
    if (a.layers == "auto") {
      o.num_layers = 0;
    } else {
      try {
        size_t used = 0;
        o.num_layers = std::stoi(a.layers, &used);
        if (used != a.layers.size() || o.num_layers < 1) throw std::invalid_argument(a.layers);
      } catch (const std::exception&) {
        return Status::InvalidArgument("--layers '" + a.layers + "' must be 'auto' or a positive number");
      }
    }
    // Only gate_prob signatures use the gate weights (the report's table then has no gate_prob row): the rest
    // reads the ids alone, a third of the trace, and counts them per request while the chunks inflate.
    TraceReadOptions read_options;
    read_options.weights = o.variant == SignatureVariant::kGateProb;
    const auto t0 = Clock::now();
    ELDR_ASSIGN_OR_RETURN(TraceCounts counts, ReadTraceCounts(a.trace, read_options));
    seconds_read = seconds_since(t0);
    auto r = Calibrate(counts, o, &report);
    if (!r.ok()) return Interrupted() ? InterruptStatus().WithPrefix(a.out) : r.status().WithPrefix(a.trace);
    calib = std::move(r).value();
  }
  report.seconds_read = seconds_read;
  const auto t_write = Clock::now();
  ELDR_RETURN_IF_ERROR(WriteCalibration(calib, calib_out));  // to its temporary: committed with the report below
  report.seconds_write = seconds_since(t_write);
  nlohmann::json j = report.ToJson();
  j["out"] = a.out;
  j["K"] = calib.num_clusters;
  j["tau"] = calib.tau;
  j["variant"] = SignatureVariantName(calib.signature.variant);
  j["features"] = SignatureFeaturesName(calib.features);
  j["balance"] = ClusterBalanceName(calib.balance);
  if (report_out) ELDR_RETURN_IF_ERROR(report_out->Write(DumpJson(j) + "\n"));
  ELDR_RETURN_IF_ERROR(outputs.CommitAll());
  if (!a.quiet)
    PrintResult(a.as_json, report.ToText() + "clusters " + DescribeBalance(calib.balance) + "\nwrote " + a.out + "\n",
                DumpJson(j));
  return Status::Ok();
}

}  // namespace

void AddCalibrateCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Fit signatures (IDF, greedy layer mask) and balanced k-means clusters (by decode work, the default, or "
      "by request count) into calibration.h5, or "
      "--refit stored signatures for a new decoder count");
  cmd->add_option("--trace", a->trace, "HDF5 routing trace to calibrate on")->check(NonEmptyPath());
  cmd->add_option("--refit", a->refit, "existing calibration.h5 to re-cluster (no trace needed)")
      ->check(NonEmptyPath());
  cmd->add_option("--decoders,-K", a->options.num_decoders, "number of decode workers K")->required();
  cmd->add_option("--out,-o", a->out, "calibration.h5 to write")->required()->check(NonEmptyPath());
  cmd->add_option("--signature", a->variant, "signature variant: count_idf, count, sqrt, binary, gate_prob")
      ->capture_default_str();
  cmd->add_option("--features", a->features,
                  "evaluation option: prefill (default: the prompt's expert counts, what the router sees online) or "
                  "decode (IDF, layer selection, signatures and clusters from each request's decode tokens: the "
                  "clairvoyant ceiling of any signature; only 'eldr simulate --route-on decode' can route with it)")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers, "layers in the mask: auto (N*, where rho peaks) or N (greedy prefix)")
      ->capture_default_str();
  cmd->add_option_function<double>(
         "--tau",
         [a](const double& v) {
           a->options.tau = v;
           a->tau_given = true;
         },
         "routing band width stored for the router (default 0.1; --refit keeps the stored value)")
      ->check(InRange(NumberRange::AtLeast(0)));
  cmd->add_option("--seed", a->options.seed, "seed for k-means++, restarts, holdout and pair sampling")
      ->capture_default_str()
      ->check(SeedValue());
  cmd->add_option("--restarts", a->options.restarts, "k-means restarts (best objective kept)")
      ->capture_default_str()
      ->check(InRange(IntRange::Between(1, 1 << 20)));
  cmd->add_option("--holdout", a->options.holdout, "fraction of requests held out to measure rho on unseen requests")
      ->capture_default_str()
      ->check(InRange(NumberRange{0, 1, false, true}));
  cmd->add_option("--max-pairs", a->options.max_pairs, "request pairs sampled for rho (0 = all pairs)")
      ->capture_default_str()
      ->check(InRange(IntRange::AtLeast(0)));
  cmd->add_option("--balance", a->balance,
                  "cluster capacity: work (default: each cluster's expected decode work, Σ of its requests' decode "
                  "tokens), count (requests per cluster, the published calibration) or none (plain spherical "
                  "k-means, ablation); --refit keeps the stored one unless given");
  cmd->add_option("--report", a->report, "also write the report as JSON to this file")->check(NonEmptyPath());
  auto* json = cmd->add_flag("--json", a->as_json, "print the report as JSON");
  cmd->add_flag("--quiet", a->quiet, "print nothing on success")->excludes(json);
  cmd->callback([=] {
    a->balance_given = cmd->count("--balance") > 0;
    a->fit_only_given.clear();
    for (const char* fit_only : {"--signature", "--layers", "--features", "--holdout", "--max-pairs"}) {
      if (cmd->count(fit_only) > 0) a->fit_only_given.push_back(fit_only);
    }
    *action = [=] { return RunCalibrate(*a); };
  });
}

void AddInspectCommand(CLI::App& app, Action* action) {
  auto path = std::make_shared<std::string>();
  auto trace_path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("inspect", "Summarise a calibration.h5; with --trace, check it against a trace");
  cmd->add_option("calibration", *path, "calibration.h5")->required()->check(NonEmptyPath());
  cmd->add_option("--trace", *trace_path, "routing trace to score with this calibration (rho, nearest centroids)")
      ->check(NonEmptyPath());
  cmd->add_flag("--json", *as_json, "print JSON");
  cmd->callback([=] {
    *action = [=]() -> Status {
      auto calib = ReadCalibration(*path);
      if (!calib.ok()) {
        // A trace given by mistake gets a pointer to the right command.
        auto f = h5::File::OpenReadOnly(*path);
        if (f.ok() && f->Exists("/tokens/topk_ids")) {
          return Status::InvalidArgument(*path + ": is a routing trace, not a calibration; use 'eldr trace stats'");
        }
        return calib.status();
      }
      nlohmann::json j = CalibrationSummaryJson(calib.value());
      std::string text = DescribeCalibration(calib.value());
      // A /placement (eldr place calib) is read and checked as serve reads it, so a damaged one is found here.
      ELDR_ASSIGN_OR_RETURN(StoredPlacements placed, ReadPlacements(*path, calib->shape.num_layers,
                                                                    calib->shape.num_experts, 0, calib->num_clusters));
      if (placed.present) {
        j["placement"] = {{"algorithm", placed.algorithm},   {"num_ranks", placed.num_ranks},
                          {"num_slots", placed.num_slots},   {"num_nodes", placed.num_nodes},
                          {"num_groups", placed.num_groups}, {"clusters_using_global", placed.from_global}};
        text +=
            "placement: " + (placed.algorithm.empty() ? std::string("(algorithm not recorded)") : placed.algorithm) +
            ", " + std::to_string(placed.num_slots) + " slots on " + std::to_string(placed.num_ranks) + " ranks (" +
            std::to_string(placed.num_nodes) + " nodes, " + std::to_string(placed.num_groups) + " groups); " +
            std::to_string(placed.from_global.size()) + " of " + std::to_string(calib->num_clusters) +
            " clusters use the global placement\n";
      }
      if (!trace_path->empty()) {
        ELDR_ASSIGN_OR_RETURN(Trace t, ReadTrace(*trace_path));
        ELDR_ASSIGN_OR_RETURN(TraceCheck check,
                              CheckTraceAgainstCalibration(calib.value(), t, *trace_path, *path, 20000, calib->seed));
        j["trace_check"] = check.ToJson();
        text += "\ntrace " + *trace_path + ": " + std::to_string(check.num_requests) + " requests, rho " +
                Fmt(check.rho, 4) + "; nearest centroid counts";
        for (auto c : check.nearest_centroid_counts) text += " " + std::to_string(c);
        text += "\n";
      }
      PrintResult(*as_json, text, DumpJson(j));
      return Status::Ok();
    };
  });
}

}  // namespace eldr::cli
