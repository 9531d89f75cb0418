#include "runtime/comm/kv_transport.h"

#include <algorithm>
#include <string>

#include "runtime/comm/transport.h"

namespace eldr {

namespace {

constexpr int kKvTag = 77;
constexpr size_t kMaxChunk = size_t{1} << 30;

class MpiKvTransport : public KvTransport {
 public:
  explicit MpiKvTransport(MPI_Comm comm) : comm_(comm) {}
  const char* name() const override { return "mpi"; }
  Status Send(int dest, const void* buffer, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(buffer);
    for (size_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      if (MPI_Send(p + off, n, MPI_BYTE, dest, kKvTag, comm_) != MPI_SUCCESS) {
        return Status::IoError("MPI_Send of KV to rank " + std::to_string(dest) + " failed");
      }
    }
    return Status::Ok();
  }
  Status Recv(int source, void* buffer, size_t bytes) override {
    auto* p = static_cast<uint8_t*>(buffer);
    for (size_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      if (MPI_Recv(p + off, n, MPI_BYTE, source, kKvTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        return Status::IoError("MPI_Recv of KV from rank " + std::to_string(source) + " failed");
      }
    }
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }
  Status SendFromHost(int dest, const void* host, size_t bytes) override { return Send(dest, host, bytes); }
  Status RecvToHost(int source, void* host, size_t bytes) override { return Recv(source, host, bytes); }

 private:
  MPI_Comm comm_;
};

}  // namespace

// kv_transport_nccl.cc
Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm comm, int device);
Status CheckNcclUsable(MPI_Comm comm, int device);

Result<KvTransportKind> ParseKvTransportKind(const std::string& name) {
  if (name == "mpi") return KvTransportKind::kMpi;
  if (name == "nccl") return KvTransportKind::kNccl;
  return Status::InvalidArgument("unknown KV transport '" + name + "' (expected mpi or nccl)");
}

Result<std::unique_ptr<KvTransport>> MakeKvTransport(KvTransportKind kind, MPI_Comm comm, int device) {
  if (kind == KvTransportKind::kMpi) return std::unique_ptr<KvTransport>(new MpiKvTransport(comm));
  return MakeNcclKvTransport(comm, device);
}

Result<std::unique_ptr<KvTransport>> MakeJobKvTransport(const std::string& choice, MPI_Comm comm) {
  if (choice != "auto" && choice != "mpi" && choice != "nccl") {
    return Status::InvalidArgument("unknown KV transport '" + choice + "' (expected auto, mpi or nccl)");
  }
  if (choice == "mpi") return MakeKvTransport(KvTransportKind::kMpi, comm, 0);
  // Device = node-local rank mod visible devices (collective: every rank of comm takes part).
  MPI_Comm node = MPI_COMM_NULL;
  int local_rank = 0;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
  }
  const int devices = VisibleCudaDevices();
  const int device = devices > 0 ? local_rank % devices : 0;
  if (choice == "nccl") return MakeKvTransport(KvTransportKind::kNccl, comm, device);
  // auto: NCCL where every rank can have a device of its own (agreed: every rank gets the same verdict).
  const KvTransportKind kind = CheckNcclUsable(comm, device).ok() ? KvTransportKind::kNccl : KvTransportKind::kMpi;
  return MakeKvTransport(kind, comm, device);
}

}  // namespace eldr
