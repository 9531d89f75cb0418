#include "runtime/comm/kv_transport.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

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

// kv_transport_nccl.cc. `names`: the rank each rank of `comm` is called in errors (empty: its own).
Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm comm, int device, const std::vector<int>& names);
Status CheckNcclUsable(MPI_Comm comm, int device, const std::vector<int>& names);

Result<KvTransportKind> ParseKvTransportKind(const std::string& name) {
  if (name == "mpi") return KvTransportKind::kMpi;
  if (name == "nccl") return KvTransportKind::kNccl;
  return Status::InvalidArgument("unknown KV transport '" + name + "' (expected mpi or nccl)");
}

Result<std::unique_ptr<KvTransport>> MakeKvTransport(KvTransportKind kind, MPI_Comm comm, int device) {
  if (kind == KvTransportKind::kMpi) return std::unique_ptr<KvTransport>(new MpiKvTransport(comm));
  return MakeNcclKvTransport(comm, device, {});
}

namespace {

// A member transport addressed by ranks of the job's communicator, over a transport of the members' own
// communicator (peer world rank → member index).
class MemberKvTransport : public KvTransport {
 public:
  MemberKvTransport(std::unique_ptr<KvTransport> inner, std::vector<int> member_of)
      : inner_(std::move(inner)), member_of_(std::move(member_of)) {}
  const char* name() const override { return inner_->name(); }
  Status Send(int dest, const void* buffer, size_t bytes) override {
    ELDR_ASSIGN_OR_RETURN(int d, Peer(dest));
    return inner_->Send(d, buffer, bytes);
  }
  Status Recv(int source, void* buffer, size_t bytes) override {
    ELDR_ASSIGN_OR_RETURN(int s, Peer(source));
    return inner_->Recv(s, buffer, bytes);
  }
  Status Synchronize() override { return inner_->Synchronize(); }
  Status SendFromHost(int dest, const void* host, size_t bytes) override {
    ELDR_ASSIGN_OR_RETURN(int d, Peer(dest));
    return inner_->SendFromHost(d, host, bytes);
  }
  Status RecvToHost(int source, void* host, size_t bytes) override {
    ELDR_ASSIGN_OR_RETURN(int s, Peer(source));
    return inner_->RecvToHost(s, host, bytes);
  }

 private:
  Result<int> Peer(int rank) const {
    if (rank < 0 || rank >= static_cast<int>(member_of_.size()) || member_of_[rank] < 0) {
      return Status::InvalidArgument("KV transport: rank " + std::to_string(rank) + " moves no KV (not a member)");
    }
    return member_of_[rank];
  }

  std::unique_ptr<KvTransport> inner_;
  std::vector<int> member_of_;  // [comm size] member index, -1 for non-members
};

// The verdict of the members (kind, or an error) on every rank of `comm`: the lowest member broadcasts it.
Status ShareVerdict(MPI_Comm comm, int root, Status local, KvTransportKind* kind) {
  struct {
    int code = 0;
    int nccl = 0;
    char message[1024] = {};
  } v;
  v.code = static_cast<int>(local.code());
  v.nccl = *kind == KvTransportKind::kNccl ? 1 : 0;
  std::strncpy(v.message, local.message().c_str(), sizeof(v.message) - 1);
  ELDR_MPI_CHECK(MPI_Bcast(&v, sizeof(v), MPI_BYTE, root, comm));
  *kind = v.nccl ? KvTransportKind::kNccl : KvTransportKind::kMpi;
  if (v.code == static_cast<int>(StatusCode::kOk)) return Status::Ok();
  return Status(static_cast<StatusCode>(v.code), v.message);
}

}  // namespace

Result<JobKvTransport> MakeJobKvTransport(const std::string& choice, MPI_Comm comm, int device, bool member) {
  if (choice != "auto" && choice != "mpi" && choice != "nccl") {
    return Status::InvalidArgument("unknown KV transport '" + choice + "' (expected auto, mpi or nccl)");
  }
  int rank = 0, size = 1;
  ELDR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ELDR_MPI_CHECK(MPI_Comm_size(comm, &size));
  // Who moves KV: member index of every rank of comm.
  std::vector<int> is_member(size, 0), member_of(size, -1), members;
  const int mine = member ? 1 : 0;
  ELDR_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, is_member.data(), 1, MPI_INT, comm));
  for (int r = 0; r < size; ++r) {
    if (!is_member[r]) continue;
    member_of[r] = static_cast<int>(members.size());
    members.push_back(r);
  }
  if (members.empty()) return Status::InvalidArgument("KV transport: no rank moves KV");
  JobKvTransport out;
  if (choice == "mpi") {
    if (member) out.transport = std::unique_ptr<KvTransport>(new MpiKvTransport(comm));
    return out;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  ELDR_MPI_CHECK(MPI_Comm_split(comm, member ? 1 : MPI_UNDEFINED, rank, &sub));
  // The members decide (collective over them), then tell every rank.
  Status local;
  KvTransportKind kind = KvTransportKind::kMpi;
  if (member) {
    local = CheckNcclUsable(sub, device, members);
    kind = local.ok() ? KvTransportKind::kNccl : KvTransportKind::kMpi;
    if (choice == "auto") local = Status::Ok();
  }
  Status shared = ShareVerdict(comm, members.front(), local, &kind);
  if (!shared.ok()) {
    if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
    return shared;
  }
  out.kind = kind;
  if (!member) return out;
  if (kind == KvTransportKind::kMpi) {
    MPI_Comm_free(&sub);
    out.transport = std::unique_ptr<KvTransport>(new MpiKvTransport(comm));
    return out;
  }
  // NCCL uses the members' MPI communicator for its bootstrap only.
  auto nccl = MakeNcclKvTransport(sub, device, members);
  MPI_Comm_free(&sub);
  if (!nccl.ok()) return nccl.status();
  out.transport = std::unique_ptr<KvTransport>(new MemberKvTransport(std::move(nccl).value(), member_of));
  return out;
}

}  // namespace eldr
