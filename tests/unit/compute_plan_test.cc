// compute: cpu | cuda | auto (runtime/serve/compute_plan.h) from hand-written rank reports: the device of each
// worker rank, the router GPU-free, and the one-line errors naming the rank and host.
#include "runtime/serve/compute_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eldr {
namespace {

RankDevice Router() { return {"h0", false, -1, ""}; }
RankDevice Worker(const std::string& host, int device, const std::string& bus) { return {host, true, device, bus}; }

// 1 router + 4 workers on two hosts, each worker a GPU of its own.
std::vector<RankDevice> OwnGpus() {
  return {Router(), Worker("h0", 0, "0000:01:00.0"), Worker("h0", 1, "0000:02:00.0"), Worker("h1", 0, "0000:01:00.0"),
          Worker("h1", 1, "0000:02:00.0")};
}

TEST(ComputePlan, WorkerDeviceIsLocalWorkerRankModDevices) {
  EXPECT_EQ(WorkerDeviceIndex(0, 8), 0);
  EXPECT_EQ(WorkerDeviceIndex(5, 8), 5);
  EXPECT_EQ(WorkerDeviceIndex(5, 2), 1);
  EXPECT_EQ(WorkerDeviceIndex(3, 1), 0);
  EXPECT_EQ(WorkerDeviceIndex(0, 0), -1);
}

TEST(ComputePlan, CpuNeedsNoDevice) {
  std::vector<RankDevice> ranks = {Router(), Worker("h0", -1, ""), Worker("h0", -1, "")};
  for (bool compiled : {false, true}) {
    auto p = PlanCompute("job.yaml", "cpu", compiled, true, ranks);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->compute, "cpu");
    EXPECT_EQ(p->devices, (std::vector<int>{-1, -1, -1}));
    EXPECT_FALSE(p->own_devices);
  }
}

TEST(ComputePlan, RouterNeverTakesAGpu) {
  std::vector<RankDevice> ranks = OwnGpus();
  ranks[0].device = 0;  // even if it reported one
  ranks[0].bus_id = "0000:01:00.0";
  auto p = PlanCompute("job.yaml", "cuda", true, true, ranks);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->compute, "cuda");
  EXPECT_EQ(p->devices, (std::vector<int>{-1, 0, 1, 0, 1}));
  EXPECT_TRUE(p->own_devices);  // the router's GPU shares rank 1's bus id and does not count
}

TEST(ComputePlan, CudaBuiltWithout) {
  auto p = PlanCompute("job.yaml", "cuda", false, false, OwnGpus());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message().rfind("job.yaml: compute: cuda but eldr was built without CUDA", 0), 0u)
      << p.status().message();
}

TEST(ComputePlan, CudaNamesTheRankWithoutADevice) {
  std::vector<RankDevice> ranks = OwnGpus();
  ranks[3] = Worker("h1", -1, "");
  auto p = PlanCompute("job.yaml", "cuda", true, true, ranks);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "job.yaml: compute: cuda: rank 3 (host h1): no CUDA device");
}

TEST(ComputePlan, CudaNamesWorkersSharingADevice) {
  std::vector<RankDevice> ranks = OwnGpus();
  ranks[4] = Worker("h1", 0, "0000:01:00.0");  // same GPU as rank 3
  auto p = PlanCompute("job.yaml", "cuda", true, true, ranks);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().rfind("job.yaml: compute: cuda: ranks 3 and 4 (host h1) share CUDA device "
                                       "0000:01:00.0",
                                       0),
            0u)
      << p.status().message();
  // The same bus id on two hosts is two GPUs.
  EXPECT_TRUE(PlanCompute("job.yaml", "cuda", true, true, OwnGpus()).ok());
}

TEST(ComputePlan, CudaRefusedWhileTheExecutorIsHostOnly) {
  auto p = PlanCompute("job.yaml", "cuda", true, false, OwnGpus());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("the executor does not run on the CUDA backend yet"), std::string::npos);
}

TEST(ComputePlan, AutoIsCudaOnlyWhenEveryWorkerHasItsOwnGpu) {
  auto yes = PlanCompute("job.yaml", "auto", true, true, OwnGpus());
  ASSERT_TRUE(yes.ok());
  EXPECT_EQ(yes->compute, "cuda");
  std::vector<RankDevice> one_missing = OwnGpus();
  one_missing[2] = Worker("h0", -1, "");
  auto no = PlanCompute("job.yaml", "auto", true, true, one_missing);
  ASSERT_TRUE(no.ok());
  EXPECT_EQ(no->compute, "cpu");
  EXPECT_EQ(no->why, "auto: rank 2 (host h0): no CUDA device");
  auto built_without = PlanCompute("job.yaml", "auto", false, true, OwnGpus());
  ASSERT_TRUE(built_without.ok());
  EXPECT_EQ(built_without->compute, "cpu");
  EXPECT_EQ(built_without->why, "auto: eldr was built without CUDA");
  auto host_executor = PlanCompute("job.yaml", "auto", true, false, OwnGpus());
  ASSERT_TRUE(host_executor.ok());
  EXPECT_EQ(host_executor->compute, "cpu");
  EXPECT_TRUE(host_executor->own_devices);  // the devices are still chosen (the KV transport may use them)
  EXPECT_EQ(host_executor->devices, (std::vector<int>{-1, 0, 1, 0, 1}));
}

TEST(ComputePlan, UnknownChoice) {
  auto p = PlanCompute("job.yaml", "gpu", true, true, OwnGpus());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "job.yaml: compute: must be cpu, cuda or auto, got 'gpu'");
}

}  // namespace
}  // namespace eldr
