// The KV-block data plane (DESIGN.md §6): prefill → decoder transfers of a request's KV. Two backends behind
// one interface, chosen at start-up: MPI (host buffers; always built) and NCCL (device buffers; built when
// CUDA and NCCL are found, selected on GPUs). Bootstrap is MPI: NCCL's unique id travels by MPI_Bcast.
// A compiled-out backend still links; asking for it fails with "built without NCCL".
//
// NCCL needs one GPU per rank (it refuses two ranks of a communicator on one device), so the NCCL backend is
// usable only when every rank of the communicator has a CUDA device of its own. Whether it is, is agreed
// collectively before any NCCL call: every rank gets the same answer (or the same error), and none is left
// waiting in a collective that another rank skipped.
//
// Thread safety: one thread per process; NCCL calls are enqueued on the stream given at construction.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "runtime/common/status.h"

namespace eldr {

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual const char* name() const = 0;
  // Sends / receives `bytes` bytes of KV between two ranks of the communicator. For NCCL the buffers are
  // device memory and the calls are asynchronous on the transport's stream (Synchronize() waits).
  virtual Status Send(int dest, const void* buffer, size_t bytes) = 0;
  virtual Status Recv(int source, void* buffer, size_t bytes) = 0;
  virtual Status Synchronize() = 0;
  // Host-buffer transfers, complete when they return. MPI moves the host buffer as it is; NCCL stages it
  // through a device buffer of the transport's (host→device on the sender, ncclSend/ncclRecv, device→host on
  // the receiver), for callers whose data lives on the host (the executor is host-only today).
  // REQUIRES: the peer makes the matching call for every transfer, with the same byte count and in the same
  // order (NCCL point-to-point pairs a rank's sends to a peer with that peer's receives in order).
  virtual Status SendFromHost(int dest, const void* host, size_t bytes) = 0;
  virtual Status RecvToHost(int source, void* host, size_t bytes) = 0;
};

enum class KvTransportKind { kMpi, kNccl };
Result<KvTransportKind> ParseKvTransportKind(const std::string& name);  // "mpi" or "nccl"

// Collective over `comm`: every rank must call it with the same kind. `device` selects the GPU for NCCL
// (a rank-local index; -1: none). NCCL: FailedPrecondition on every rank, with the same message, when the binary is
// built without NCCL, when some rank cannot use its device, or when two ranks on one host share a device.
Result<std::unique_ptr<KvTransport>> MakeKvTransport(KvTransportKind kind, MPI_Comm comm, int device);

// Whether this binary was built with the NCCL backend.
bool NcclCompiledIn();
// CUDA devices this process sees (0 when built without NCCL, or with no device or driver).
int VisibleCudaDevices();

// A job's KV transport from its configured choice, collective over `comm` (every rank calls it with the same
// `choice`; all agree on the kind):
//   "mpi"  → MPI.
//   "nccl" → NCCL, or FailedPrecondition on every rank saying why it cannot be used (see MakeKvTransport).
//   "auto" → NCCL when the binary has it and every member rank has a CUDA device of its own, else MPI.
// `device`: this rank's GPU, chosen once by the caller (serve: runtime/serve/compute_plan.h, the same device as
// its compute backend), -1 for none. `member`: whether this rank moves KV. Ranks with member false (serve's
// router, rank 0) take part in the agreement only: they need no GPU, are not in the NCCL communicator, and get
// no transport (JobKvTransport::transport is null). Members' transports take ranks of `comm` as peers (the
// NCCL communicator of the members is an internal detail), and the errors name ranks of `comm`.
// InvalidArgument for another choice.
struct JobKvTransport {
  KvTransportKind kind = KvTransportKind::kMpi;
  std::unique_ptr<KvTransport> transport;  // null when not a member
  const char* name() const { return kind == KvTransportKind::kNccl ? "nccl" : "mpi"; }
};
Result<JobKvTransport> MakeJobKvTransport(const std::string& choice, MPI_Comm comm, int device, bool member = true);

}  // namespace eldr
