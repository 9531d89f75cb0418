// The NCCL KV transport (built with ELDR_HAVE_NCCL), or its stand-in that says the binary was built without it.
#include "runtime/comm/kv_transport.h"

#ifdef ELDR_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace eldr {

#ifdef ELDR_HAVE_NCCL

bool NcclCompiledIn() { return true; }

namespace {

class NcclKvTransport : public KvTransport {
 public:
  NcclKvTransport(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {}
  ~NcclKvTransport() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "nccl"; }
  Status Send(int dest, const void* buffer, size_t bytes) override {
    const ncclResult_t r = ncclSend(buffer, bytes, ncclUint8, dest, comm_, stream_);
    if (r != ncclSuccess) return Status::IoError(std::string("ncclSend: ") + ncclGetErrorString(r));
    return Status::Ok();
  }
  Status Recv(int source, void* buffer, size_t bytes) override {
    const ncclResult_t r = ncclRecv(buffer, bytes, ncclUint8, source, comm_, stream_);
    if (r != ncclSuccess) return Status::IoError(std::string("ncclRecv: ") + ncclGetErrorString(r));
    return Status::Ok();
  }
  Status Synchronize() override {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return Status::IoError(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
    return Status::Ok();
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm comm, int device) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (cudaSetDevice(device) != cudaSuccess) {
    return Status::FailedPrecondition("rank " + std::to_string(rank) + ": cannot use CUDA device " +
                                      std::to_string(device));
  }
  ncclUniqueId id;
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) return Status::IoError("ncclGetUniqueId failed");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);  // bootstrap over MPI, kept apart from the data plane
  ncclComm_t nccl;
  const ncclResult_t r = ncclCommInitRank(&nccl, size, id, rank);
  if (r != ncclSuccess) return Status::IoError(std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  return std::unique_ptr<KvTransport>(new NcclKvTransport(nccl, stream));
}

#else

bool NcclCompiledIn() { return false; }

Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm, int) {
  return Status::FailedPrecondition(
      "KV transport nccl: built without NCCL (reconfigure with ELDR_WITH_CUDA=ON ELDR_WITH_NCCL=ON on a machine with "
      "the CUDA toolkit and NCCL)");
}

#endif

}  // namespace eldr
