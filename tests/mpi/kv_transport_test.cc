// KvTransport under mpirun -np 2 (label mpi): 3 MiB of KV from rank 0 arrive intact on rank 1 over MPI; asking
// for NCCL fails cleanly where it is compiled out or no GPU is present, with the same message on every rank
// and no rank left in a collective; the job-level choice (auto, mpi, nccl) agrees on every rank; where NCCL
// can be used (a GPU per rank), host buffers staged through the device arrive intact; a message whose payload
// comes late (its sender stalled after the header) keeps Transport::RecvPolling calling its hook, and arrives
// intact; Transport::Post keeps order with blocking sends and drains. GoogleTest with a main
// that silences ranks other than 0 and fails if any rank fails (STYLE.md).
#include "runtime/comm/kv_transport.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/transport.h"

namespace eldr {
namespace {

// Transport::Post never blocks and keeps MPI's order with blocking sends to the same rank and tag: a 4 MiB posted
// message (too large to go out before its receiver matches it) is still posted after a blocking send and another
// post behind it; the receiver, let go only then (by a message of another tag), gets the three in posting order,
// byte for byte, and the posted sends then complete (posted() drains to 0).
TEST(Transport, PostKeepsOrderWithSendAndDrainsOnceReceived) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int kTag = 43, kGoTag = 44;
  auto bytes = [](size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 13 + seed);
    return v;
  };
  const std::vector<uint8_t> a = bytes(4 << 20, 1), b = bytes(16, 2), c = bytes(100, 3);
  MpiTransport tr(MPI_COMM_WORLD);
  if (rank == 0) {
    tr.Post(1, kTag, a);
    tr.Send(1, kTag, b.data(), b.size());
    tr.Post(1, kTag, c);
    EXPECT_GE(tr.posted(), 1u) << "the 4 MiB message went out before its receiver matched it";
    const uint8_t go = 1;
    tr.Send(1, kGoTag, &go, 1);
    for (int i = 0; i < 100000 && tr.posted() > 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    EXPECT_EQ(tr.posted(), 0u);
  } else if (rank == 1) {
    EXPECT_EQ(tr.Recv(0, kGoTag).payload.size(), 1u);
    EXPECT_EQ(tr.Recv(0, kTag).payload, a);
    EXPECT_EQ(tr.Recv(0, kTag).payload, b);
    EXPECT_EQ(tr.Recv(0, kTag).payload, c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The sender's side written out by hand, in MpiTransport's wire format (a uint64 byte count, then the bytes,
// both with the message's tag), stalling 300 ms between the two as a stopped or dying sender would: until the
// payload is posted no poll can complete, so the receiver's hook must have run.
TEST(Transport, RecvPollingAnswersWhileThePayloadIsLate) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int kTag = 41;
  std::vector<uint8_t> payload(1 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + 3);
  if (rank == 0) {
    const uint64_t total = payload.size();
    ASSERT_EQ(MPI_Send(&total, 1, MPI_UINT64_T, 1, kTag, MPI_COMM_WORLD), MPI_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(MPI_Send(payload.data(), static_cast<int>(payload.size()), MPI_BYTE, 1, kTag, MPI_COMM_WORLD),
              MPI_SUCCESS);
  } else if (rank == 1) {
    MpiTransport tr;
    int waits = 0;
    const Message m = tr.RecvPolling(0, Transport::kAnyTag, [&waits] { ++waits; });
    EXPECT_EQ(m.source, 0);
    EXPECT_EQ(m.tag, kTag);
    EXPECT_EQ(m.payload, payload);
    EXPECT_GT(waits, 0) << "the hook never ran while the payload was 300 ms late";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

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

// This rank's GPU as serve chooses it for a worker: node-local rank mod visible devices (-1: none).
int LocalDevice() {
  MPI_Comm node = MPI_COMM_NULL;
  int local_rank = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  const int devices = VisibleCudaDevices();
  return devices > 0 ? local_rank % devices : -1;
}

// Whether `s` is the same string on every rank.
bool SameOnEveryRank(const std::string& s) {
  const uint64_t mine = std::hash<std::string>{}(s);
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

TEST(KvTransport, JobChoiceAgreesOnEveryRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(MakeJobKvTransport("tcp", MPI_COMM_WORLD, LocalDevice()).status().code(), StatusCode::kInvalidArgument);
  auto mpi = MakeJobKvTransport("mpi", MPI_COMM_WORLD, LocalDevice());
  ASSERT_TRUE(mpi.ok());
  EXPECT_STREQ(mpi->name(), "mpi");
  // nccl either works on every rank or fails on every rank with the same line (and returns: no hang).
  auto nccl = MakeJobKvTransport("nccl", MPI_COMM_WORLD, LocalDevice());
  const std::string verdict = nccl.ok() ? std::string("ok") : nccl.status().message();
  EXPECT_TRUE(SameOnEveryRank(verdict)) << "rank " << rank << ": " << verdict;
  if (!nccl.ok()) {
    EXPECT_EQ(nccl.status().code(), StatusCode::kFailedPrecondition);
    const std::string& m = nccl.status().message();
    EXPECT_TRUE(m.find("built without NCCL") != std::string::npos ||
                m.find("no usable CUDA device") != std::string::npos ||
                m.find("share CUDA device") != std::string::npos)
        << m;
    if (!NcclCompiledIn()) {
      EXPECT_NE(m.find("built without NCCL"), std::string::npos) << m;
    } else if (VisibleCudaDevices() == 0) {
      EXPECT_NE(m.find("no usable CUDA device on ranks 0, 1"), std::string::npos) << m;
    }
  }
  // auto is nccl exactly where nccl can be made, on every rank.
  if (nccl.ok()) nccl.value().transport.reset();  // release the communicator before making another
  auto automatic = MakeJobKvTransport("auto", MPI_COMM_WORLD, LocalDevice());
  ASSERT_TRUE(automatic.ok()) << automatic.status().message();
  EXPECT_STREQ(automatic->name(), verdict == "ok" ? "nccl" : "mpi");
  EXPECT_TRUE(SameOnEveryRank(automatic->name()));
}

// serve's router (rank 0) moves no KV: it takes part in the agreement, needs no GPU, gets no transport, and an
// error names the member ranks only.
TEST(KvTransport, NonMemberAgreesWithoutAGpu) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool member = rank != 0;
  const int local_device = LocalDevice();  // collective: every rank calls it
  const int device = member ? local_device : -1;
  auto nccl = MakeJobKvTransport("nccl", MPI_COMM_WORLD, device, member);
  const std::string verdict = nccl.ok() ? std::string("ok") : nccl.status().message();
  EXPECT_TRUE(SameOnEveryRank(verdict)) << "rank " << rank << ": " << verdict;
  if (nccl.ok()) {
    EXPECT_EQ(nccl->transport == nullptr, !member);
    nccl.value().transport.reset();
  } else if (NcclCompiledIn() && VisibleCudaDevices() == 0) {
    EXPECT_NE(verdict.find("no usable CUDA device on rank 1 "), std::string::npos) << verdict;
    EXPECT_EQ(verdict.find("rank 0"), std::string::npos) << verdict;
  }
  auto automatic = MakeJobKvTransport("auto", MPI_COMM_WORLD, device, member);
  ASSERT_TRUE(automatic.ok()) << automatic.status().message();
  EXPECT_STREQ(automatic->name(), verdict == "ok" ? "nccl" : "mpi");
  EXPECT_TRUE(SameOnEveryRank(automatic->name()));
  EXPECT_EQ(automatic->transport == nullptr, !member);
  if (!member) {
    auto mpi = MakeJobKvTransport("mpi", MPI_COMM_WORLD, device, member);
    ASSERT_TRUE(mpi.ok());
    EXPECT_EQ(mpi->transport, nullptr);
  } else {
    ASSERT_TRUE(MakeJobKvTransport("mpi", MPI_COMM_WORLD, device, member).ok());
  }
}

TEST(KvTransport, HostBuffersArriveIntact) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  // MPI always; NCCL (staged through the device) where every rank has a GPU of its own.
  for (const char* choice : {"mpi", "auto"}) {
    auto t = MakeJobKvTransport(choice, MPI_COMM_WORLD, LocalDevice());
    ASSERT_TRUE(t.ok()) << t.status().message();
    // Two transfers back to back, of different sizes: received in the order sent.
    for (size_t n : {size_t{3} << 18, size_t{1000}}) {
      std::vector<float> kv(n);
      if (rank == 0) {
        std::iota(kv.begin(), kv.end(), static_cast<float>(n));
        ASSERT_TRUE(t->transport->SendFromHost(1, kv.data(), n * sizeof(float)).ok());
      } else if (rank == 1) {
        ASSERT_TRUE(t->transport->RecvToHost(0, kv.data(), n * sizeof(float)).ok());
        for (size_t i = 0; i < n; i += 97) ASSERT_EQ(kv[i], static_cast<float>(n + i)) << t->name() << " " << i;
        ASSERT_EQ(kv.back(), static_cast<float>(2 * n - 1));
      }
    }
  }
}

}  // namespace
}  // namespace eldr
