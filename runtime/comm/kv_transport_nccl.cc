// The NCCL KV transport (built with ELDR_HAVE_NCCL), or its stand-in that says the binary was built without it.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/kv_transport.h"

#ifdef ELDR_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace eldr {

#ifdef ELDR_HAVE_NCCL

bool NcclCompiledIn() { return true; }

int VisibleCudaDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

namespace {

std::string CudaError(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

class NcclKvTransport : public KvTransport {
 public:
  NcclKvTransport(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {}
  ~NcclKvTransport() override {
    if (staging_) cudaFree(staging_);
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
    if (e != cudaSuccess) return Status::IoError(CudaError("cudaStreamSynchronize", e));
    return Status::Ok();
  }
  Status SendFromHost(int dest, const void* host, size_t bytes) override {
    if (bytes == 0) return Status::Ok();  // the receiver skips it too (same byte count)
    ELDR_RETURN_IF_ERROR(Reserve(bytes));
    const cudaError_t e = cudaMemcpyAsync(staging_, host, bytes, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) return Status::IoError(CudaError("cudaMemcpyAsync (KV host to device)", e));
    ELDR_RETURN_IF_ERROR(Send(dest, staging_, bytes));
    return Synchronize();  // the staging buffer is reused by the next transfer
  }
  Status RecvToHost(int source, void* host, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    ELDR_RETURN_IF_ERROR(Reserve(bytes));
    ELDR_RETURN_IF_ERROR(Recv(source, staging_, bytes));
    const cudaError_t e = cudaMemcpyAsync(host, staging_, bytes, cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess) return Status::IoError(CudaError("cudaMemcpyAsync (KV device to host)", e));
    return Synchronize();
  }

 private:
  // Grows the device staging buffer to at least `bytes` (never shrinks: a decoder sees similar KV sizes).
  Status Reserve(size_t bytes) {
    if (bytes <= staging_bytes_) return Status::Ok();
    if (staging_) cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    const cudaError_t e = cudaMalloc(&staging_, bytes);
    if (e != cudaSuccess) {
      return Status::ResourceExhausted(
          CudaError(("cudaMalloc of " + std::to_string(bytes) + " bytes of KV staging").c_str(), e));
    }
    staging_bytes_ = bytes;
    return Status::Ok();
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  void* staging_ = nullptr;  // [staging_bytes_] device memory
  size_t staging_bytes_ = 0;
};

// What a rank reports about its device before any NCCL call (fixed size for MPI_Allgather).
struct DeviceProbe {
  char usable = 0;
  char host[64] = {};
  char bus_id[32] = {};  // PCI bus id of the device this rank would use
};

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

}  // namespace

// Collective over `comm`: OK on every rank when every rank can use CUDA device `device` and no two ranks of
// one host would use the same device; otherwise the same FailedPrecondition on every rank.
Status CheckNcclUsable(MPI_Comm comm, int device, const std::vector<int>& names) {
  auto name = [&](int r) { return names.empty() ? r : names[r]; };
  int size = 1;
  MPI_Comm_size(comm, &size);
  DeviceProbe mine;
  ::gethostname(mine.host, sizeof(mine.host) - 1);
  const int count = VisibleCudaDevices();
  if (count > 0 && device >= 0 && device < count && cudaSetDevice(device) == cudaSuccess &&
      cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id) - 1, device) == cudaSuccess) {
    mine.usable = 1;
  } else {
    cudaGetLastError();
  }
  std::vector<DeviceProbe> all(size);
  MPI_Allgather(&mine, sizeof(DeviceProbe), MPI_BYTE, all.data(), sizeof(DeviceProbe), MPI_BYTE, comm);
  std::vector<int> without;
  for (int r = 0; r < size; ++r) {
    if (!all[r].usable) without.push_back(name(r));
  }
  if (!without.empty()) {
    return Status::FailedPrecondition("KV transport nccl: no usable CUDA device on rank" +
                                      std::string(without.size() > 1 ? "s " : " ") + RankList(without) +
                                      " (NCCL needs one GPU per rank)");
  }
  for (int a = 0; a < size; ++a) {
    for (int b = a + 1; b < size; ++b) {
      if (std::strcmp(all[a].host, all[b].host) == 0 && std::strcmp(all[a].bus_id, all[b].bus_id) == 0) {
        return Status::FailedPrecondition("KV transport nccl: ranks " + std::to_string(name(a)) + " and " +
                                          std::to_string(name(b)) + " share CUDA device " + all[a].bus_id + " on " +
                                          all[a].host + " (NCCL needs one GPU per rank: bind one device per rank)");
      }
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm comm, int device, const std::vector<int>& names) {
  ELDR_RETURN_IF_ERROR(CheckNcclUsable(comm, device, names));  // every rank passes or every rank fails
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  struct {
    int ok = 0;
    ncclUniqueId id;
  } boot;
  if (rank == 0) boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess ? 1 : 0;
  MPI_Bcast(&boot, sizeof(boot), MPI_BYTE, 0, comm);  // bootstrap over MPI, kept apart from the data plane
  if (!boot.ok) return Status::IoError("KV transport nccl: ncclGetUniqueId failed on rank 0");
  ncclComm_t nccl = nullptr;
  const ncclResult_t r = ncclCommInitRank(&nccl, size, boot.id, rank);
  cudaStream_t stream = nullptr;
  int ok = r == ncclSuccess && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? 1 : 0;
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) {
    if (stream) cudaStreamDestroy(stream);
    if (r == ncclSuccess) ncclCommAbort(nccl);
    return Status::IoError(std::string("KV transport nccl: communicator set-up failed") +
                           (r != ncclSuccess ? std::string(" here: ") + ncclGetErrorString(r) : " on another rank"));
  }
  return std::unique_ptr<KvTransport>(new NcclKvTransport(nccl, stream));
}

#else

bool NcclCompiledIn() { return false; }
int VisibleCudaDevices() { return 0; }

Status CheckNcclUsable(MPI_Comm, int, const std::vector<int>&) {
  return Status::FailedPrecondition(
      "KV transport nccl: built without NCCL (reconfigure with ELDR_WITH_CUDA=ON ELDR_WITH_NCCL=ON on a machine with "
      "the CUDA toolkit and NCCL)");
}

Result<std::unique_ptr<KvTransport>> MakeNcclKvTransport(MPI_Comm comm, int device, const std::vector<int>& names) {
  return CheckNcclUsable(comm, device, names);  // always the "built without NCCL" error
}

#endif

}  // namespace eldr
