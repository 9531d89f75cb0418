// Subcommands of the `eldr` binary. Each Add*Command registers a CLI11 subcommand whose callback
// stores the action to run; main() runs it and turns a failed Status into one line on stderr and
// exit code 1.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/common/status.h"
#include "runtime/common/yaml.h"
#include "runtime/router/router.h"

namespace eldr::cli {

using Action = std::function<Status()>;

void AddTraceCommand(CLI::App& app, Action* action);
void AddCalibrateCommand(CLI::App& app, Action* action);
void AddInspectCommand(CLI::App& app, Action* action);
void AddRouteCommand(CLI::App& app, Action* action);
void AddServeCommand(CLI::App& app, Action* action);
void AddPlaceCommand(CLI::App& app, Action* action);
void AddSimulateCommand(CLI::App& app, Action* action);

// A serve rank whose command line did not parse: it takes part in the ranks' agreement on the job config with
// `message` as its error, so that an error every rank has (mpirun gives them all the same command line) is printed
// once, by rank 0, and one rank's own (an MPMD launch) by that rank. Never returns OK.
Status ServeAfterCommandLineError(const std::string& message);

// CLI11 validators that check an option like the config key it overrides (runtime/common/yaml.h), before
// CLI11 converts it: "--tau: must be >= 0, got 'nan' (not a number)", "--max-batch: must be an integer in [1, 1048576],
// got '0'". An option whose unset state matters is read with add_option_function into a std::optional.
inline CLI::Validator InRange(const NumberRange& range) {
  return CLI::Validator(
      [range](std::string& text) {
        const Status st = CheckNumber("", text, range);
        return st.ok() ? std::string() : st.message().substr(1);
      },
      range.Describe());
}
inline CLI::Validator InRange(const IntRange& range) {
  return CLI::Validator(
      [range](std::string& text) {
        const Status st = CheckInteger("", text, range);
        return st.ok() ? std::string() : st.message().substr(1);
      },
      range.Describe());
}

// A path option given as "" (an unset variable in a script) is refused ("--out: the path is empty"), never taken
// for the option's absence and its default (place calib would update --calib in place, simulate would keep the
// config's --trace, calibrate would skip --report).
// A name option (--policy) likewise ("--policy: the value is empty; ..."): the config's value would run instead.
inline CLI::Validator NonEmpty(std::string message) {
  return CLI::Validator([message](std::string& text) { return text.empty() ? message : std::string(); }, "");
}
inline CLI::Validator NonEmptyPath() { return NonEmpty("the path is empty; give a file name"); }
inline CLI::Validator NonEmptyName() { return NonEmpty("the value is empty; give one (see --help)"); }

// A seed: a whole number in [0, 2^64 - 1]. CLI11 converts "-1" and "99999999999999999999" to 2^64 - 1 silently.
inline CLI::Validator SeedValue() {
  return CLI::Validator(
      [](std::string& text) {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
          return "must be an integer in [0, 18446744073709551615], got '" + text + "'";
        }
        return std::string();
      },
      "");
}

// Refuses an option given on the command line that `policy` ignores (router.h SettingsOf): --calib and --route-on
// (signature policies), --tau, --load-bound, --harm-weight, naming the option, the policy and the ones it applies to.
// A required option is never refused.
// `own`: options of the command itself that a setting governs (route's --cost-model: eldr's price, where simulate's
// is the simulator's).
struct PolicyOption {
  const char* option;
  bool PolicySettings::*applies;
  const char* what;  // "the band width": what the policies that read it read
};
Status CheckPolicyOptions(const CLI::App& cmd, RoutingPolicy policy, std::initializer_list<PolicyOption> own = {});

// The settings read from the environment (ELDR_NUM_THREADS, ELDR_MEMORY_BUDGET), each checked: InvalidArgument
// naming the variable. main.cc checks them before every command but serve, which agrees on them over its ranks.
Status CheckEnvironment();

// Flushes stdout and says whether everything printed reached it. A report that did not (a full disk, a closed pipe)
// is a failed run, not exit 0 with a truncated report: false after one line on stderr saying so.
bool StdoutWritten();

// Prints `text` to stdout, or `json` (indented) when as_json.
void PrintResult(bool as_json, const std::string& text, const std::string& json);

// The options of a parsed command, each as given or its default ("--tau": "0.1"; flags as true/false; options
// without a value or default as null): the resolved configuration of the run. Its path ("place evaluate") is
// "command".
nlohmann::json OptionsJson(const CLI::App& cmd);
// `report` with the provenance of runtime/common/provenance.h (eldr_version, git_sha, build_type, date) and
// config = OptionsJson(cmd).
nlohmann::json WithProvenance(nlohmann::json report, const CLI::App& cmd);

}  // namespace eldr::cli
