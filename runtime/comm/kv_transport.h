// The KV-block data plane (DESIGN.md §6): prefill → decoder transfers of a request's KV. Two backends behind
// one interface, chosen at start-up: MPI (host buffers; always built) and NCCL (device buffers; built when
// CUDA and NCCL are found, selected on GPUs). Bootstrap is MPI: NCCL's unique id travels by MPI_Bcast.
// A compiled-out backend still links; asking for it fails with "built without NCCL".
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
};

enum class KvTransportKind { kMpi, kNccl };
Result<KvTransportKind> ParseKvTransportKind(const std::string& name);  // "mpi" or "nccl"

// Collective over `comm`: every rank must call it with the same kind. `device` selects the GPU for NCCL.
Result<std::unique_ptr<KvTransport>> MakeKvTransport(KvTransportKind kind, MPI_Comm comm, int device);

// Whether this binary was built with the NCCL backend.
bool NcclCompiledIn();

}  // namespace eldr
