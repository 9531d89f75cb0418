#include "runtime/serve/compute_plan.h"

#include <unistd.h>

#include <cstring>

#include "kernels/backend.h"
#include "runtime/comm/transport.h"

namespace eldr {

namespace {

std::string RankAt(int rank, const RankDevice& d) { return "rank " + std::to_string(rank) + " (host " + d.host + ")"; }

// The first problem with the workers' devices, or "" when every worker has one of its own.
std::string DeviceProblem(const std::vector<RankDevice>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].worker && ranks[r].device < 0) return RankAt(static_cast<int>(r), ranks[r]) + ": no CUDA device";
  }
  for (size_t a = 0; a < ranks.size(); ++a) {
    for (size_t b = a + 1; b < ranks.size(); ++b) {
      const RankDevice &x = ranks[a], &y = ranks[b];
      if (!x.worker || !y.worker || x.host != y.host) continue;
      // Without a bus id (a device that cannot be queried) the index decides.
      const bool same = !x.bus_id.empty() && !y.bus_id.empty() ? x.bus_id == y.bus_id : x.device == y.device;
      if (!same) continue;
      return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " (host " + x.host + ") share CUDA device " +
             (x.bus_id.empty() ? std::to_string(x.device) : x.bus_id) +
             " (one GPU per worker rank: run through launch/gpu-bind, or give the node as many GPUs as worker ranks)";
    }
  }
  return "";
}

// Fixed-size record of RankDevice for MPI_Allgather.
struct WireDevice {
  char host[64] = {};
  char bus_id[32] = {};
  int32_t worker = 0;
  int32_t device = -1;
};

}  // namespace

int WorkerDeviceIndex(int local_worker_rank, int num_devices) {
  return num_devices > 0 ? local_worker_rank % num_devices : -1;
}

bool ExecutorRunsOnCuda() { return false; }

Result<ComputePlan> PlanCompute(const std::string& config_path, const std::string& choice, bool cuda_compiled,
                                bool executor_runs_on_cuda, const std::vector<RankDevice>& ranks) {
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(config_path + ": compute: " + m); };
  if (choice != "cpu" && choice != "cuda" && choice != "auto") {
    return bad("must be cpu, cuda or auto, got '" + choice + "'");
  }
  ComputePlan plan;
  for (const RankDevice& d : ranks) plan.devices.push_back(d.worker ? d.device : -1);
  const std::string problem = cuda_compiled ? DeviceProblem(ranks) : "eldr was built without CUDA";
  plan.own_devices = problem.empty();
  if (choice == "cpu") {
    plan.why = "compute: cpu";
    return plan;
  }
  if (choice == "cuda") {
    if (!cuda_compiled) {
      return bad("cuda but eldr was built without CUDA (reconfigure with -DELDR_WITH_CUDA=ON on a machine with nvcc)");
    }
    if (!problem.empty()) return bad("cuda: " + problem);
    if (!executor_runs_on_cuda) {
      return bad(
          "cuda: the executor does not run on the CUDA backend yet (it needs device-resident weights, issue 13 "
          "step 2); use compute: cpu or auto");
    }
    plan.compute = "cuda";
    plan.why = "compute: cuda";
    return plan;
  }
  if (!problem.empty()) {
    plan.why = "auto: " + problem;
  } else if (!executor_runs_on_cuda) {
    plan.why = "auto: every worker rank has a GPU, but the executor does not run on the CUDA backend yet";
  } else {
    plan.compute = "cuda";
    plan.why = "auto: every worker rank has a GPU of its own";
  }
  return plan;
}

Result<ComputePlan> AgreeCompute(const std::string& config_path, const std::string& choice, MPI_Comm comm) {
  int rank = 0, size = 1;
  ELDR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ELDR_MPI_CHECK(MPI_Comm_size(comm, &size));
  // The node's worker ranks: rank 0 splits off by itself (color 0), the workers (color 1) then split by node.
  MPI_Comm workers = MPI_COMM_NULL, node = MPI_COMM_NULL;
  ELDR_MPI_CHECK(MPI_Comm_split(comm, rank == 0 ? 0 : 1, rank, &workers));
  ELDR_MPI_CHECK(MPI_Comm_split_type(workers, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local_worker_rank = 0;
  ELDR_MPI_CHECK(MPI_Comm_rank(node, &local_worker_rank));
  MPI_Comm_free(&node);
  MPI_Comm_free(&workers);

  WireDevice mine;
  ::gethostname(mine.host, sizeof(mine.host) - 1);
  mine.worker = rank == 0 ? 0 : 1;
  if (rank != 0) {
    mine.device = WorkerDeviceIndex(local_worker_rank, kernels::CudaDeviceCount());
    const std::string bus = mine.device >= 0 ? kernels::CudaDeviceBusId(mine.device) : "";
    std::strncpy(mine.bus_id, bus.c_str(), sizeof(mine.bus_id) - 1);
  }
  std::vector<WireDevice> all(size);
  ELDR_MPI_CHECK(MPI_Allgather(&mine, sizeof(WireDevice), MPI_BYTE, all.data(), sizeof(WireDevice), MPI_BYTE, comm));
  std::vector<RankDevice> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = {all[r].host, all[r].worker != 0, all[r].device, all[r].bus_id};
  return PlanCompute(config_path, choice, kernels::CudaBackendCompiled(), ExecutorRunsOnCuda(), ranks);
}

}  // namespace eldr
