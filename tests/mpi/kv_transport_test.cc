// KvTransport under mpirun -np 2 (label mpi): 3 MiB of KV from rank 0 arrive intact on rank 1 over MPI; asking
// for NCCL fails cleanly where it is compiled out or no GPU is present. GoogleTest with a main that silences
// ranks other than 0 and fails if any rank fails (STYLE.md).
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>
#include <vector>

#include "runtime/comm/kv_transport.h"

namespace eldr {
namespace {

TEST(KvTransport, MpiBlocksArriveIntact) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto t = MakeKvTransport(KvTransportKind::kMpi, MPI_COMM_WORLD, 0);
  ASSERT_TRUE(t.ok());
  std::vector<float> kv(3 << 18);  // 3 MiB
  if (rank == 0) {
    std::iota(kv.begin(), kv.end(), 0.5f);
    ASSERT_TRUE((*t)->Send(1, kv.data(), kv.size() * sizeof(float)).ok());
  } else if (rank == 1) {
    ASSERT_TRUE((*t)->Recv(0, kv.data(), kv.size() * sizeof(float)).ok());
    for (size_t i = 0; i < kv.size(); i += 4097) ASSERT_EQ(kv[i], static_cast<float>(i) + 0.5f) << i;
    ASSERT_EQ(kv.back(), static_cast<float>(kv.size() - 1) + 0.5f);
  }
  ASSERT_TRUE((*t)->Synchronize().ok());
}

TEST(KvTransport, NcclIsRefusedClearlyWithoutIt) {
  if (NcclCompiledIn()) GTEST_SKIP() << "built with NCCL; the GPU tests cover it";
  auto t = MakeKvTransport(KvTransportKind::kNccl, MPI_COMM_WORLD, 0);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("built without NCCL"), std::string::npos);
  EXPECT_EQ(ParseKvTransportKind("tcp").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eldr

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // only rank 0 prints
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
