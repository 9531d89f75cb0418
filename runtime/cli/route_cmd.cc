// eldr route: preview the decode-routing policies on a trace with a calibration.
#include "runtime/calib/calibration.h"
#include "runtime/cli/commands.h"
#include "runtime/common/json_util.h"
#include "runtime/eval/route_replay.h"

namespace eldr::cli {

void AddRouteCommand(CLI::App& app, Action* action) {
  struct Args {
    std::string calib, trace, policy = "all", cost_model;
    RouteReplayOptions options;
    bool as_json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "route",
      "Replay a trace through the router (every policy side by side): requests per decoder, domain purity, "
      "band sizes, distinct experts per decode step");
  cmd->add_option("--calib", a->calib, "calibration.h5 (its K is the number of decoders)")
      ->required()
      ->check(NonEmptyPath());
  cmd->add_option("--trace", a->trace, "HDF5 routing trace to replay")->required()->check(NonEmptyPath());
  cmd->add_option("--policy", a->policy,
                  "all, or one of random, round_robin, jsq, p2c, domain, locality_top1, eldr, eldr_paper, eldr_tail")
      ->capture_default_str();
  cmd->add_option_function<double>(
         "--tau", [a](const double& v) { a->options.tau = v; },
         "band width of eldr_paper and eldr_tail (default: the calibration's)")
      ->check(InRange(NumberRange::AtLeast(0)));
  cmd->add_option("--rate", a->options.rate, "arrival rate, requests/s (Poisson; 0 or inf = all at once)")
      ->capture_default_str()
      ->check(InRange(NumberRange::AtLeast(0).OrInf()));
  cmd->add_option("--step-ms", a->options.step_ms, "decode step time of the load model")
      ->capture_default_str()
      ->check(InRange(NumberRange::Above(0)));
  cmd->add_option("--cap", a->options.admission_cap, "admission cap per decoder (0 = none)")
      ->capture_default_str()
      ->check(InRange(IntRange::AtLeast(0)));
  cmd->add_option("--repeat", a->options.repeat, "replay the trace this many times")
      ->capture_default_str()
      ->check(InRange(IntRange::Between(1, 1 << 30)));
  cmd->add_option("--seed", a->options.seed, "seed of arrivals and random policies")
      ->capture_default_str()
      ->check(SeedValue());
  cmd->add_option("--cost-model", a->cost_model,
                  "decode cost model YAML that eldr prices its routing in (configs/costs/*.yaml; default: a step "
                  "costs its distinct experts)")
      ->check(NonEmptyPath());
  cmd->add_option("--max-batch", a->options.max_batch, "eldr: sequences per decode step")
      ->capture_default_str()
      ->check(InRange(IntRange::Between(1, 1 << 20)));
  cmd->add_flag("--json", a->as_json, "print JSON");
  cmd->callback([=] {
    *action = [=]() -> Status {
      RouteReplayOptions o = a->options;
      if (a->policy != "all") {
        ELDR_ASSIGN_OR_RETURN(RoutingPolicy p, ParseRoutingPolicy(a->policy));
        o.policies = {p};
        ELDR_RETURN_IF_ERROR(CheckPolicyOptions(*cmd, p,
                                                {{"--cost-model", &PolicySettings::step_cost, "the price's cost model"},
                                                 {"--max-batch", &PolicySettings::step_cost, "the price's batch"}}));
      }
      if (!a->cost_model.empty()) {
        ELDR_ASSIGN_OR_RETURN(CostModel m, LoadCostModel(a->cost_model));
        o.step_cost = m;
      }
      ELDR_ASSIGN_OR_RETURN(Calibration calib, ReadCalibration(a->calib));
      ELDR_ASSIGN_OR_RETURN(Trace trace, ReadTrace(a->trace));
      ELDR_ASSIGN_OR_RETURN(RouteReplayReport rep, ReplayRoutes(trace, calib, o, a->trace, a->calib));
      PrintResult(a->as_json, rep.ToText(), DumpJson(WithProvenance(rep.ToJson(), *cmd)));
      return Status::Ok();
    };
  });
}

}  // namespace eldr::cli
