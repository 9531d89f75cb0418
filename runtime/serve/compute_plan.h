// Where an `eldr serve` job computes (the job config's `compute: cpu | cuda | auto`, job_config.h) and which
// GPU each worker rank uses (DESIGN.md §6 backends).
//
// Rank 0 (the router) is not a worker: it runs no model and never takes a GPU. A worker rank's device is its
// local rank among the *worker* ranks of its node, modulo the CUDA devices the process sees (WorkerDeviceIndex).
// It is chosen once, at start, and the same device serves the worker's compute backend and its KV transport
// (comm/kv_transport.h). Under launch/gpu-bind (CUDA_VISIBLE_DEVICES = one device per worker rank, or the one
// Slurm's --gpus-per-task gave the task) every worker sees one device and takes index 0; without it, on a node
// with as many GPUs as worker ranks, worker i takes GPU i. Both give every worker a GPU of its own.
//
//   cpu   every rank computes on the CPU backend; devices are still chosen (the KV transport may use them).
//   cuda  every worker rank must have a CUDA device of its own: otherwise the job fails at start with one line,
//         "rank 3 (host h): no CUDA device" or "ranks 2 and 3 (host h) share CUDA device B", and a build without
//         CUDA fails with "compute: cuda but eldr was built without CUDA".
//   auto  cuda when the build has CUDA, every worker rank has a device of its own and the executor runs on the
//         CUDA backend; otherwise cpu. The plan says why (`why`), which rank 0 prints on the job's startup line.
//
// The executor (runtime/model/executor.h) takes host weights only so far: until device-resident weights exist
// (issue 13 step 2) ExecutorRunsOnCuda() is false, auto resolves to cpu, and an explicit cuda fails with one
// line saying so, after the device checks above.
//
// Thread safety: PlanCompute is a pure function; AgreeCompute is collective over its communicator.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// What one rank reports about itself before the plan (gathered from every rank of the job).
struct RankDevice {
  std::string host;
  bool worker = true;  // false for rank 0, the router
  int device = -1;     // the device it would use (WorkerDeviceIndex), -1: router or no device visible
  std::string bus_id;  // PCI bus id of that device ("" when none or unknown)
};

struct ComputePlan {
  std::string compute = "cpu";  // "cpu" or "cuda"
  std::string why;              // for the startup line: "auto: ..." or "compute: cuda" or "compute: cpu"
  std::vector<int> devices;     // [world] each rank's device, -1 for the router and ranks without one
  bool own_devices = false;     // every worker rank has a device, and no two of one host share one
};

// A worker's device from its local rank among the node's worker ranks: local_worker_rank mod num_devices, or
// -1 when num_devices <= 0.
int WorkerDeviceIndex(int local_worker_rank, int num_devices);

// Whether the executor runs on the CUDA compute backend in this build (false until device weights exist).
bool ExecutorRunsOnCuda();

// The plan from every rank's report (ranks[r] is rank r). `choice`: cpu, cuda or auto. Errors
// (InvalidArgument, one line, naming `config_path` and the key): an unknown choice; cuda on a build without CUDA;
// cuda where a worker has no device or shares one (the first such rank and its host); cuda where the executor
// cannot run on it.
Result<ComputePlan> PlanCompute(const std::string& config_path, const std::string& choice, bool cuda_compiled,
                                bool executor_runs_on_cuda, const std::vector<RankDevice>& ranks);

// Collective over `comm` (rank 0 is the router): each rank finds its local rank among its node's worker ranks,
// its device and that device's bus id, the reports are gathered on every rank, and every rank gets the same
// PlanCompute result (or the same error).
Result<ComputePlan> AgreeCompute(const std::string& config_path, const std::string& choice, MPI_Comm comm);

}  // namespace eldr
