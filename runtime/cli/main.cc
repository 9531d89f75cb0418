// eldr: expert-locality-aware decode routing for MoE serving. One binary, one subcommand per task.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "runtime/cli/commands.h"
#include "runtime/common/check.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/parallel.h"
#include "runtime/common/provenance.h"
#include "runtime/common/signals.h"

namespace eldr::cli {

void PrintResult(bool as_json, const std::string& text, const std::string& json) {
  std::cout << (as_json ? json + "\n" : text);
  std::cout.flush();
}

nlohmann::json OptionsJson(const CLI::App& cmd) {
  nlohmann::json options = nlohmann::json::object();
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->get_name() == "--help" || opt->get_name().empty()) continue;
    const std::string name = opt->get_name();
    if (opt->get_type_size() == 0) {  // a flag
      options[name] = opt->count() > 0;
    } else if (opt->count() > 0) {
      const auto& results = opt->results();
      options[name] = results.size() == 1 ? nlohmann::json(results[0]) : nlohmann::json(results);
    } else if (!opt->get_default_str().empty()) {
      options[name] = opt->get_default_str();
    } else {
      options[name] = nullptr;
    }
  }
  std::string path = cmd.get_name();
  for (const CLI::App* p = cmd.get_parent(); p != nullptr && p->get_parent() != nullptr; p = p->get_parent()) {
    path = p->get_name() + " " + path;
  }
  return {{"command", path}, {"options", options}};
}

Status CheckPolicyOptions(const CLI::App& cmd, RoutingPolicy policy, std::initializer_list<PolicyOption> own) {
  std::vector<PolicyOption> knobs = {{"--calib", &PolicySettings::calibration, "a calibration"},
                                     {"--route-on", &PolicySettings::calibration, "a signature"},
                                     {"--tau", &PolicySettings::tau, "the band width"},
                                     {"--load-bound", &PolicySettings::load_bound, "the bounded load"},
                                     {"--harm-weight", &PolicySettings::harm_weight, "the harm weight"}};
  knobs.insert(knobs.end(), own.begin(), own.end());
  for (const PolicyOption& k : knobs) {
    const CLI::Option* opt = cmd.get_option_no_throw(k.option);
    // A required option (eldr route's --calib: its K is the decoder count) is read whatever the policy.
    if (opt == nullptr || opt->count() == 0 || opt->get_required() || SettingsOf(policy).*k.applies) continue;
    // Given as its default (`--route-on prefill`, what every policy does), an option changes nothing to refuse.
    if (!opt->get_default_str().empty() && opt->results().size() == 1 && opt->results()[0] == opt->get_default_str())
      continue;
    std::string users;
    for (RoutingPolicy p : AllRoutingPolicies()) {
      if (!(SettingsOf(p).*k.applies)) continue;
      if (!users.empty()) users += ", ";
      users += RoutingPolicyName(p);
    }
    std::string message = k.option;
    message += " does not apply to policy ";
    message += RoutingPolicyName(policy);
    message += ", which would ignore it (";
    message += k.what;
    message += " is read by " + users + "); drop it or choose one of those policies";
    return Status::InvalidArgument(message);
  }
  return Status::Ok();
}

Status CheckEnvironment() {
  ELDR_RETURN_IF_ERROR(ThreadsFromEnvironment().status());
  return MemoryBudgetFromEnvironment().status();
}

bool StdoutWritten() {
  // The buffered rest is flushed here, and every earlier write's error is remembered by the stream.
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int flush_errno = errno;
  if (flushed && !std::ferror(stdout) && !std::cout.fail()) return true;
  std::fprintf(stderr,
               "eldr: error: stdout: the output could not be written in full (%s): what was printed is incomplete "
               "(files the command wrote are complete); redirect stdout to a disk with space\n",
               !flushed && flush_errno != 0 ? std::strerror(flush_errno) : "a write failed");
  return false;
}

nlohmann::json WithProvenance(nlohmann::json report, const CLI::App& cmd) {
  const nlohmann::json provenance = Provenance(OptionsJson(cmd));  // named: items() must not outlive it
  for (const auto& [key, value] : provenance.items()) report[key] = value;
  return report;
}

}  // namespace eldr::cli

// SIGINT, SIGTERM and SIGHUP are recorded from the process's first instant: .preinit_array runs before any shared
// library's initialisers (libcublasLt's take ~0.1 s), which a constructor of this file would run after.
__attribute__((section(".preinit_array"),
               used)) static void (*record_signals_from_start)(int, char**, char**) = eldr::RecordSignalsFromStart;

// One line for a signal that ended a command before it did anything: the shell's exit code of a run it killed.
static int InterruptedExit() {
  std::fprintf(stderr, "eldr: %s\n", eldr::InterruptStatus().message().c_str());
  return eldr::InterruptExitCode();
}

int main(int argc, char** argv) {
  CLI::App app{
      "eldr: expert-locality-aware decode routing for MoE serving with prefill-decode disaggregation.\n"
      "Offline: import or synthesise routing traces, calibrate signatures and balanced clusters,\n"
      "preview decode routing policies on a trace."};
  app.set_version_flag("--version", eldr::VersionString());
  // One line, as every other error: CLI11's default adds a second ("Run with --help for more information.").
  app.failure_message(
      [](const CLI::App*, const CLI::Error& e) { return "eldr: error: " + std::string(e.what()) + " (see --help)\n"; });
  app.require_subcommand(1);
  app.footer("Run 'eldr <command> --help' for the options of each command.");
  eldr::cli::Action action;
  eldr::cli::AddTraceCommand(app, &action);
  eldr::cli::AddCalibrateCommand(app, &action);
  eldr::cli::AddInspectCommand(app, &action);
  eldr::cli::AddRouteCommand(app, &action);
  eldr::cli::AddServeCommand(app, &action);
  eldr::cli::AddPlaceCommand(app, &action);
  eldr::cli::AddSimulateCommand(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A rank of an eldr serve job of several processes agrees on the error with the others, so that an error every
    // rank has is printed once, by rank 0, and one rank's own (an MPMD launch) by that rank. Not --print-ranks,
    // which runs without MPI (launch/eldr-launch calls it, in a Slurm batch script too).
    bool serve_rank = argc > 1 && std::string(argv[1]) == "serve" && eldr::LauncherWorldSize() > 1;
    for (int i = 2; i < argc && serve_rank; ++i) serve_rank = std::string(argv[i]) != "--print-ranks";
    if (serve_rank && e.get_exit_code() != 0) {
      (void)eldr::cli::ServeAfterCommandLineError(std::string(e.what()) + " (see eldr serve --help)");
      return 1;
    }
    // A signal since the process started (RecordSignalsFromStart): its line instead of the help or the parse error
    // (a serve rank above takes it over with its own handlers, as the ranks agree on the error).
    if (eldr::Interrupted()) return InterruptedExit();
    const int code = app.exit(e);  // --help and --version print to stdout
    return code == 0 && !eldr::cli::StdoutWritten() ? 1 : code;
  }
  // A signal since the process started (RecordSignalsFromStart, above) ends any command but an eldr serve job here,
  // with the line of an interrupt, once the signals' inherited actions are back (so that none comes in between
  // unseen): a command that polls no interrupt ends at a signal as it would have. A serve job's handlers take such
  // a signal over (InstallServeSignalHandlers); --print-ranks runs no job.
  const CLI::App* serve = app.get_subcommand("serve");
  if (!app.got_subcommand("serve") || serve->get_option("--print-ranks")->count() > 0) {
    eldr::RestoreInheritedSignalActions();
    if (eldr::Interrupted()) return InterruptedExit();
  }
  try {
    // The environment's settings are checked before any work, as the options are; eldr serve checks them on every
    // rank and agrees on the result, so that an error all ranks see is printed once.
    eldr::Status st = app.got_subcommand("serve") ? eldr::Status::Ok() : eldr::cli::CheckEnvironment();
    if (st.ok()) st = action ? action() : eldr::Status::InvalidArgument("no command given");
    // A command that installed the interrupt handlers (runtime/common/signals.h) has unwound and removed its
    // temporaries by now: one line, and the shell's exit code of a run killed by that signal.
    if (eldr::Interrupted()) {
      std::fprintf(stderr, "eldr: %s\n",
                   st.ok() ? eldr::InterruptStatus().message().c_str()
                           : ("error: " + eldr::PrintableMessage(st.message())).c_str());
      return eldr::InterruptExitCode();
    }
    if (!st.ok()) {
      if (!st.message().empty()) {  // empty: printed already
        std::fprintf(stderr, "eldr: error: %s\n", eldr::PrintableMessage(st.message()).c_str());
      }
      return 1;
    }
    if (!eldr::cli::StdoutWritten()) return 1;
  } catch (const eldr::Error& e) {
    std::fprintf(stderr, "eldr: internal error: %s\n", eldr::PrintableMessage(e.what()).c_str());
    return 3;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "eldr: error: out of memory (an input is larger than this machine can hold)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "eldr: error: %s\n", eldr::PrintableMessage(eldr::JsonErrorText(e)).c_str());
    return 1;
  }
  return 0;
}
