// CPU backend: host memory, synchronous "streams", and each operation forwarded to its reference kernel in
// kernels/cpu/ops.cc, so a run through the interface is bit-identical to a direct kernel call (and keeps the
// kernels' batch invariance). The stream arguments are unused: every call has completed when it returns.
#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "runtime/common/check.h"

namespace eldr::kernels {

void ThrowDTypeMismatch(DType have, DType want) {
  throw Error(__FILE__, __LINE__, std::string("a buffer of ") + DTypeName(have) + " used as " + DTypeName(want));
}

namespace {

// 64-byte aligned host memory (whole cache lines, any SIMD width).
class CpuBuffer : public Buffer {
 public:
  CpuBuffer(DType dtype, int64_t size) : Buffer(Allocate(dtype, size), dtype, size) {}
  ~CpuBuffer() override { std::free(data()); }

 private:
  static void* Allocate(DType dtype, int64_t size) {
    ELDR_CHECK(size >= 0, "buffer of " << size << " elements");
    if (size == 0) return nullptr;
    const size_t bytes = (static_cast<size_t>(size) * DTypeBytes(dtype) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
};

class CpuStream : public Stream {};
class CpuEvent : public Event {};

class CpuBackendImpl : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool host_memory() const override { return true; }

  std::unique_ptr<Buffer> Alloc(DType dtype, int64_t size) override { return std::make_unique<CpuBuffer>(dtype, size); }
  void CopyHostToDevice(void* dst, const void* src, size_t bytes, Stream&) override { Copy(dst, src, bytes); }
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes, Stream&) override { Copy(dst, src, bytes); }
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream&) override { Copy(dst, src, bytes); }
  void MemsetZero(void* dst, size_t bytes, Stream&) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }

  std::unique_ptr<Stream> CreateStream() override { return std::make_unique<CpuStream>(); }
  std::unique_ptr<Event> CreateEvent() override { return std::make_unique<CpuEvent>(); }
  void RecordEvent(Event&, Stream&) override {}
  void StreamWaitEvent(Stream&, Event&) override {}
  void SynchronizeEvent(Event&) override {}
  void SynchronizeStream(Stream&) override {}

  void EmbeddingGather(const EmbeddingGatherParams& p, Stream&) override { kernels::EmbeddingGather(p); }
  void RmsNorm(const RmsNormParams& p, Stream&) override { kernels::RmsNorm(p); }
  void Linear(const LinearParams& p, Stream&) override { kernels::Linear(p); }
  void ApplyRope(const RopeParams& p, Stream&) override { kernels::ApplyRope(p); }
  void WriteKvSlots(const KvSlotWriteParams& p, Stream&) override { kernels::WriteKvSlots(p); }
  void PrefillAttention(const PrefillAttentionParams& p, Stream&) override { kernels::PrefillAttention(p); }
  void PagedAttentionDecode(const PagedAttentionDecodeParams& p, Stream&) override { kernels::PagedAttentionDecode(p); }
  void ResidualAdd(const ResidualAddParams& p, Stream&) override { kernels::ResidualAdd(p); }
  void Mlp(const MlpParams& p, Stream&) override { kernels::Mlp(p); }
  void GateTopK(const GateTopKParams& p, Stream&) override { kernels::GateTopK(p); }
  void ReplayTopK(const ReplayTopKParams& p, Stream&) override { kernels::ReplayTopK(p); }
  void MoeExperts(const MoeParams& p, Stream&) override { kernels::MoeExperts(p); }
  void ExpertFfn(const ExpertFfnParams& p, Stream&) override { kernels::ExpertFfn(p); }
  void MoeCombine(const MoeCombineParams& p, Stream&) override { kernels::MoeCombine(p); }
  void ArgMax(const ArgMaxParams& p, Stream&) override { kernels::ArgMax(p); }
  void PackKv(const KvPackParams& p, Stream&) override { kernels::PackKv(p); }
  void UnpackKv(const KvPackParams& p, Stream&) override { kernels::UnpackKv(p); }

 private:
  static void Copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackendImpl>(); }

Backend& CpuBackend() {
  static CpuBackendImpl backend;
  return backend;
}

}  // namespace eldr::kernels
