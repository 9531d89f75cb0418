// The compute-backend interface (DESIGN.md §6 backends): the one seam between the model executor
// (runtime/model/executor.h), the routed-expert backends above it (runtime/model/expert_backend.h,
// runtime/serve/expert_parallel.h) and the kernels. Small, in the manner of ggml's ggml-backend-impl.h:
// device buffers, host↔device copies, streams and events, and every operation the executor runs, each a
// launcher taking a params struct and a stream (DeepEP style).
//
// Implementations:
//   cpu   kernels/cpu (cpu_backend.cc over kernels/cpu/ops.cc). Always built. The oracle: batch-invariant and
//         deterministic; every other backend is tested against it with a per-operation tolerance
//         (tests/gpu/backend_gpu_test.cc). Memory is host memory; streams and events are trivial (every call
//         completes before it returns).
//   cuda  kernels/cuda (cuda/cuda_backend.cc over kernels/cuda/cuda_ops.h), built when ELDR_HAVE_CUDA.
//         Asynchronous on its streams. Operations it does not implement yet throw eldr::Error naming the
//         operation ("... is not implemented in the CUDA backend yet"); they never fall back silently.
// CreateBackend() picks one at start-up; asking for a compiled-out backend gives "built without CUDA".
//
// Params structs are those of kernels/ops.h (the CPU launchers have the same signatures minus the stream).
// In a call through a Backend every pointer in them is that backend's memory (Buffer::data() or a pointer
// into it) unless its comment says "host"; each carries its shape in ops.h. WeightMatrix / ExpertWeights
// descriptors are host structs whose data pointers are backend memory; a backend may keep state derived from
// a descriptor's address (a device pointer table), so REQUIRES: a descriptor is not changed while in use.
// PagedKv carries its dtype: the CPU backend keeps KV in f32, a device backend may keep it in bf16.
//
// Errors: invalid shapes, out-of-range ids or slots, unimplemented operations and device failures throw
// eldr::Error (bugs or unrecoverable failures, runtime/common/check.h); CreateBackend returns a Status for
// what the user chose wrongly.
//
// Thread safety: a Backend instance, its buffers, streams and events are used by one thread at a time (a
// device backend keeps per-device state such as a cuBLAS handle and scratch memory). The CPU backend is
// stateless and may be shared by threads (CpuBackend()). Use one Backend per worker thread; a worker gets
// its own streams from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kernels/ops.h"
#include "runtime/common/status.h"

namespace eldr::kernels {

class Backend;

// A block of backend memory holding `size()` elements of `dtype()`, owned by this object and freed by its
// destructor. REQUIRES: destroyed before the Backend that allocated it, and after every stream operation that
// uses it has completed. Contents after Alloc are unspecified (MemsetZero them if needed).
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }  // backend memory; readable by the host only if Backend::host_memory()
  DType dtype() const { return dtype_; }
  int64_t size() const { return size_; }  // elements
  size_t bytes() const { return static_cast<size_t>(size_) * DTypeBytes(dtype_); }
  // data() as T*; throws unless T is the buffer's element type (float f32, uint16_t bf16, int32_t i32,
  // int64_t i64, int8_t i8).
  template <typename T>
  T* As() const;

 protected:
  Buffer(void* data, DType dtype, int64_t size) : data_(data), dtype_(dtype), size_(size) {}

 private:
  void* data_;
  DType dtype_;
  int64_t size_;
};

// An ordered queue of work on a backend (cudaStream_t on CUDA). Operations on one stream run in call order;
// operations on different streams are ordered only through events. CPU: every operation completes before its
// call returns, so a stream is only a token.
class Stream {
 public:
  virtual ~Stream() = default;
};

// A point in a stream's work (cudaEvent_t on CUDA): recorded on one stream, waited on by another stream or by
// the host. CPU: always complete.
class Event {
 public:
  virtual ~Event() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  // True when backend memory is host memory: host pointers may be passed to operations, and buffers read and
  // written by the host directly (the CPU backend). False for device memory: reach it through the copies.
  virtual bool host_memory() const = 0;

  // ---- memory ----
  // A buffer of `size` elements (size >= 0; 0 gives a buffer whose data() may be null). Throws on exhaustion.
  virtual std::unique_ptr<Buffer> Alloc(DType dtype, int64_t size) = 0;
  // Copies `bytes` bytes. `dst`/`src` named device are backend memory, host ones are host memory. Asynchronous
  // on `stream`: REQUIRES the host source stays valid and unchanged, and the host destination is not read,
  // until the stream has reached the copy (SynchronizeStream or an event). The CPU backend copies at once.
  virtual void CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes, Stream& stream) = 0;
  virtual void CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes, Stream& stream) = 0;
  virtual void CopyDeviceToDevice(void* device_dst, const void* device_src, size_t bytes, Stream& stream) = 0;
  virtual void MemsetZero(void* device_dst, size_t bytes, Stream& stream) = 0;

  // ---- streams and events ----
  virtual std::unique_ptr<Stream> CreateStream() = 0;
  virtual std::unique_ptr<Event> CreateEvent() = 0;
  // Marks the point after the work queued on `stream` so far.
  virtual void RecordEvent(Event& event, Stream& stream) = 0;
  // Later work on `stream` waits until `event` has completed (the host does not wait).
  virtual void StreamWaitEvent(Stream& stream, Event& event) = 0;
  // The host waits until `event` has completed.
  virtual void SynchronizeEvent(Event& event) = 0;
  // The host waits until all work queued on `stream` has completed.
  virtual void SynchronizeStream(Stream& stream) = 0;

  // ---- operations (kernels/ops.h has each one's contract and shapes) ----
  // Queued on `stream` after the work already there (a device backend returns before the work is done: read
  // outputs on the host only after a copy and SynchronizeStream). Inputs must stay valid until then.
  // Attention block.
  virtual void EmbeddingGather(const EmbeddingGatherParams& p, Stream& stream) = 0;
  virtual void RmsNorm(const RmsNormParams& p, Stream& stream) = 0;
  virtual void Linear(const LinearParams& p, Stream& stream) = 0;
  virtual void ApplyRope(const RopeParams& p, Stream& stream) = 0;
  virtual void WriteKvSlots(const KvSlotWriteParams& p, Stream& stream) = 0;
  virtual void PrefillAttention(const PrefillAttentionParams& p, Stream& stream) = 0;
  virtual void PagedAttentionDecode(const PagedAttentionDecodeParams& p, Stream& stream) = 0;
  virtual void ResidualAdd(const ResidualAddParams& p, Stream& stream) = 0;
  // FFN block: dense MLP, router, routed experts. MoeExperts is the whole routed-expert part of a layer from
  // device-resident ids (the permute plan, grouped expert GEMMs and combine are the backend's business: a
  // device may group on the device); ExpertFfn and MoeCombine are its two halves for callers that move rows
  // between ranks in between (expert-parallel groups). ExpertFfnParams::experts and MoeParams::experts: host.
  virtual void Mlp(const MlpParams& p, Stream& stream) = 0;
  virtual void GateTopK(const GateTopKParams& p, Stream& stream) = 0;
  virtual void ReplayTopK(const ReplayTopKParams& p, Stream& stream) = 0;
  virtual void MoeExperts(const MoeParams& p, Stream& stream) = 0;
  virtual void ExpertFfn(const ExpertFfnParams& p, Stream& stream) = 0;
  virtual void MoeCombine(const MoeCombineParams& p, Stream& stream) = 0;
  // Sampling and KV transfer.
  virtual void ArgMax(const ArgMaxParams& p, Stream& stream) = 0;
  virtual void PackKv(const KvPackParams& p, Stream& stream) = 0;
  virtual void UnpackKv(const KvPackParams& p, Stream& stream) = 0;

  // ---- set-up ----
  // The largest calls a worker will make (its max batch, or its longest prompt for prefill), so that a device
  // backend sizes its scratch memory once, at start: calls within these shapes then never allocate (nor free,
  // which on CUDA synchronises the whole device). The CPU backend has no scratch: nothing to do.
  struct ScratchShape {
    int max_tokens = 0;
    int max_in_features = 0;               // Linear: the widest input (hidden, or q heads * head_dim)
    int hidden = 0, mlp_intermediate = 0;  // dense MLP / shared experts
    int top_k = 1, num_experts = 0, expert_intermediate = 0;  // routed experts
  };
  virtual void ReserveScratch(const ScratchShape& shape, Stream& stream) {
    (void)shape;
    (void)stream;
  }

 protected:
  Backend() = default;
};

// The process's CPU backend (stateless; shared by every caller that does not choose another). Thread safe.
Backend& CpuBackend();

// True when this build contains kernels/cuda (configured with ELDR_HAVE_CUDA).
bool CudaBackendCompiled();

// OK when the build contains kernels/cuda and at least one CUDA device is usable. Otherwise
// FailedPrecondition: "built without CUDA (reconfigure with ELDR_WITH_CUDA=ON on a machine with nvcc)" when
// compiled out, or "no CUDA device ..." when no device (or no driver) is present. Thread safe.
Status CudaBackendStatus();

// CUDA devices this process sees (0 when built without CUDA, or with no device or driver). Thread safe.
int CudaDeviceCount();
// The PCI bus id of CUDA device `device` ("0000:3b:00.0"), which tells two ranks of one host whether they would
// share a GPU; "" when built without CUDA or when the device cannot be queried. Thread safe.
std::string CudaDeviceBusId(int device);

// The compute backend named `name` ("cpu", or "cuda" on CUDA device `device`), chosen once at start-up.
// InvalidArgument for another name; CudaBackendStatus()'s FailedPrecondition for "cuda" when it cannot be
// used; InvalidArgument when `device` is not in [0, device count).
Result<std::unique_ptr<Backend>> CreateBackend(const std::string& name, int device = 0);

// ---- inline ----

// The DType of an element type (the types Buffer::As accepts).
template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    return DType::kBF16;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return DType::kI32;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return DType::kI64;
  } else {
    static_assert(std::is_same_v<T, int8_t>, "no DType for this element type");
    return DType::kI8;
  }
}

// Throws eldr::Error: a buffer of `have` read as `want`.
[[noreturn]] void ThrowDTypeMismatch(DType have, DType want);

template <typename T>
T* Buffer::As() const {
  if (dtype_ != DTypeOf<T>()) ThrowDTypeMismatch(dtype_, DTypeOf<T>());
  return static_cast<T*>(data_);
}

}  // namespace eldr::kernels
