// eldr serve: the PD-disaggregated serving job, one process per rank (mpirun -np N, or srun --mpi=pmix).
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "runtime/cli/commands.h"
#include "runtime/comm/transport.h"
#include "runtime/cost/cost_model.h"
#include "runtime/job/job_config.h"
#include "runtime/serve/serve.h"

namespace eldr::cli {

namespace {

// This rank's part of the job (every rank calls it once): MPI start, the ranks' agreement on `load_job`'s outcome
// (the job config with the command line's overrides, or a command line that did not parse), then the job.
Status ServeRank(const std::function<Result<JobConfig>()>& load_job, bool progress) {
  InstallServeSignalHandlers();
  // The job config first (it needs no MPI): its watchdog_s bounds every wait of setup on the other ranks, MPI
  // start-up's included (SetupWait). Its outcome is agreed on below.
  Result<JobConfig> job = Status::FailedPrecondition("");
  try {  // every rank reaches the agreement, an exception too
    job = load_job();
  } catch (const std::exception& e) {
    job = Status::FailedPrecondition(std::string("internal error: ") + e.what());
  }
  if (job.ok()) SetSetupWaitLimit(job->watchdog_s);
  int provided = 0;
  {
    SetupWait wait("MPI start-up");
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Status st;
  std::string role = "rank " + std::to_string(rank);
  try {
    MpiTransport transport(MPI_COMM_WORLD);
    // Agreed on, so that an error every rank sees (a config's) is printed once, by rank 0, and one only some
    // ranks see (a file missing on one node) by each of them.
    Status agreed;
    {
      SetupWait wait("the ranks' agreement on the job config");
      agreed =
          AgreeOnSetup(transport, job.ok() ? Status::Ok() : job.status(), "the job config (or parse its command line)");
    }
    if (!agreed.ok()) {
      EndServeSetup();
      if (!agreed.message().empty()) PrintRankError(role, agreed.message());
      st = Status(agreed.code(), "");
    } else {
      role = job->RoleOf(rank) + " (rank " + std::to_string(rank) + ")";
      st = RunServeJob(job.value(), transport, progress && rank == 0);
    }
  } catch (const std::exception& e) {
    st = Status::FailedPrecondition(std::string("internal error: ") + e.what());
  }
  if (!st.ok()) {
    EndServeSetup();  // a failure before the inputs' agreement ends setup here
    // Every rank sees the same config errors; print them once. Other errors name the rank and role,
    // and the job is aborted so that no rank waits forever on one that gave up.
    // An empty message: rank 0 reports this error (runtime/serve/serve.cc, AgreeOnSetup).
    if (!st.message().empty() && (rank == 0 || st.code() != StatusCode::kInvalidArgument)) {
      PrintRankError(role, st.message());
    }
    const int exit_code = ServeSignal() != 0 ? 128 + ServeSignal() : 1;  // a signal's: the shell's convention
    if (size > 1) {
      // Leave without MPI_Finalize and with a failure status: mpirun (and srun) then end every other rank,
      // the hung one included. (MPI_Abort does the same but Open MPI 4.1's mpirun sometimes stays behind.)
      ::usleep(200 * 1000);  // let rank 0's line reach the terminal first
      std::fflush(nullptr);
      std::_Exit(exit_code);
    }
    MPI_Finalize();
    if (ServeSignal() != 0) {
      std::fflush(nullptr);
      std::_Exit(exit_code);
    }
    return Status(StatusCode::kFailedPrecondition, "");
  }
  MPI_Finalize();
  return Status::Ok();
}

}  // namespace

void AddServeCommand(CLI::App& app, Action* action) {
  auto config = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  auto print_ranks = std::make_shared<bool>(false);
  auto policy = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  auto tau = std::make_shared<std::optional<double>>();
  auto load_bound = std::make_shared<std::optional<double>>();
  auto* cmd = app.add_subcommand("serve",
                                 "Run the serving job (rank 0 router, prefill and decode ranks); start it "
                                 "with mpirun -np N or srun --mpi=pmix -n N");
  cmd->add_option("--config,-c", *config, "job config YAML (topology, model, routing, KV cache, workload, output)")
      ->required()
      ->check(NonEmptyPath());
  cmd->add_flag("--quiet", *quiet, "no progress bar");
  cmd->add_flag("--print-ranks", *print_ranks, "print the world size and the rank → role map, and exit (no MPI)");
  cmd->add_option("--policy", *policy, "override routing.policy")->check(NonEmptyName());
  cmd->add_option_function<double>(
         "--tau", [tau](const double& v) { *tau = v; },
         "override routing.tau (the band width of eldr_paper and eldr_tail)")
      ->check(InRange(job_limits::kTau));
  cmd->add_option_function<double>(
         "--load-bound", [load_bound](const double& v) { *load_bound = v; },
         "override routing.load_bound (bounded-load ε of eldr, eldr_paper, eldr_tail; 0 = off, but eldr_tail routes 0 "
         "as 0.25: its bound is never off)")
      ->check(InRange(job_limits::kLoadBound));
  cmd->add_option("--output-dir", *out_dir, "override output.dir")->check(NonEmptyPath());
  cmd->callback([=] {
    *action = [=]() -> Status {
      // The job config with the command line's overrides, each checked (the same for --print-ranks and the job).
      const auto load_job = [=]() -> Result<JobConfig> {
        ELDR_RETURN_IF_ERROR(CheckEnvironment());  // ELDR_NUM_THREADS, ELDR_MEMORY_BUDGET (main.cc leaves it here)
        ELDR_ASSIGN_OR_RETURN(JobConfig job, LoadJobConfig(*config));
        // The simulate: section is eldr simulate's, but its keys are checked here too (a typo is never silent).
        ELDR_RETURN_IF_ERROR(CheckJobCostKeys(*config));
        if (!policy->empty()) {
          ELDR_ASSIGN_OR_RETURN(job.policy, ParseRoutingPolicy(*policy));
        }
        ELDR_RETURN_IF_ERROR(CheckPolicyOptions(*cmd, job.policy));
        if (*tau) job.tau = *tau;
        if (*load_bound) job.load_bound = **load_bound;
        if (!out_dir->empty()) job.output_dir = *out_dir;
        for (const auto& [option, key] : {std::pair{"--policy", "routing.policy"},
                                          {"--tau", "routing.tau"},
                                          {"--load-bound", "routing.load_bound"},
                                          {"--output-dir", "output.dir"}}) {
          if (cmd->count(option) > 0) job.overrides[key] = option;
        }
        return job;
      };
      if (*print_ranks) {
        ELDR_ASSIGN_OR_RETURN(JobConfig job, load_job());
        std::printf("ranks %d\n", job.world_size());
        for (int r = 0; r < job.world_size(); ++r) std::printf("rank %d: %s\n", r, job.RoleOf(r).c_str());
        std::printf("watchdog_s %g\n", job.watchdog_s);  // launch/eldr-launch sizes the launcher's kill delay by it
        return Status::Ok();
      }
      return ServeRank(load_job, !*quiet);
    };
  });
}

Status ServeAfterCommandLineError(const std::string& message) {
  return ServeRank([&]() -> Result<JobConfig> { return Status::InvalidArgument(message); }, false);
}

}  // namespace eldr::cli
