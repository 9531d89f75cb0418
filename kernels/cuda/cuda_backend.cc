// CUDA backend (kernels/backend.h) over the launchers of kernels/cuda/cuda_ops.h: device buffers
// (cudaMalloc), asynchronous copies, streams and events, and the operations. Not implemented yet (they throw
// "<Op> is not implemented in the CUDA backend yet"): replayed routing (ReplayTopK) and the row-level expert
// FFN of EP groups (ExpertFfn). Nothing falls back to the CPU silently.
//
// Range errors the CPU throws at once (an out-of-range token id or KV slot) are found on the device: the
// kernels set a bit of this backend's error word (pinned, mapped host memory) and skip the element, and the next
// SynchronizeStream / SynchronizeEvent throws eldr::Error naming the operation (cuda_ops.h "Device errors").
//
// Type rules of this backend: weights (WeightMatrix, ExpertWeights) are bf16; the paged KV cache is bf16;
// activations are f32 (kernels/cuda/cuda_ops.h "Precision"). A descriptor of another dtype throws.
// Streams: Linear, Mlp and MoeExperts share one cuBLAS handle and scratch buffer per backend, so issue them on
// one stream at a time (one backend per worker, as kernels/backend.h says).
// MoeParams::batch_invariant is not honoured: on a GPU the exact-token contract is replaced by a tolerance
// against the CPU oracle (the GPU issue, "Exactness on GPU").
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <map>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace eldr::kernels {
namespace {

[[noreturn]] void NotImplemented(const char* op) {
  throw Error(__FILE__, __LINE__,
              std::string(op) + " is not implemented in the CUDA backend yet (use the cpu compute backend)");
}

const cuda::Bf16* Bf16Weights(const WeightMatrix& w, const char* op) {
  ELDR_CHECK(w.dtype == DType::kBF16, op << ": the CUDA backend takes bf16 weights, not " << DTypeName(w.dtype));
  return static_cast<const cuda::Bf16*>(w.data);
}

cuda::PagedKv Bf16Cache(const PagedKv& c, const char* op) {
  ELDR_CHECK(c.dtype == DType::kBF16, op << ": the CUDA backend keeps KV in bf16, not " << DTypeName(c.dtype));
  return {static_cast<cuda::Bf16*>(c.k),
          static_cast<cuda::Bf16*>(c.v),
          c.num_blocks,
          c.block_size,
          c.num_kv_heads,
          c.head_dim};
}

class CudaBuffer : public Buffer {
 public:
  CudaBuffer(DType dtype, int64_t size) : Buffer(Allocate(dtype, size), dtype, size) {}
  ~CudaBuffer() override {
    if (data() != nullptr) (void)cudaFree(data());  // destructors never throw
  }

 private:
  static void* Allocate(DType dtype, int64_t size) {
    ELDR_CHECK(size >= 0, "buffer of " << size << " elements");
    void* p = nullptr;
    if (size > 0) ELDR_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(size) * DTypeBytes(dtype)));
    return p;
  }
};

class CudaStream : public Stream {
 public:
  CudaStream() { ELDR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() override { (void)cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent : public Event {
 public:
  CudaEvent() { ELDR_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A stream or event of this backend (another backend's is a bug).
cudaStream_t S(Stream& s) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  ELDR_CHECK(cs != nullptr, "a stream of another backend passed to the CUDA backend");
  return cs->get();
}
cudaEvent_t Ev(Event& e) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  ELDR_CHECK(ce != nullptr, "an event of another backend passed to the CUDA backend");
  return ce->get();
}

class CudaBackendImpl : public Backend {
 public:
  explicit CudaBackendImpl(int device) : ctx_(device), device_(device) {
    ELDR_CUDA_CHECK(cudaSetDevice(device_));
    ELDR_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&error_host_), sizeof(int), cudaHostAllocMapped));
    *error_host_ = 0;
    ELDR_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device_), error_host_, 0));
  }
  ~CudaBackendImpl() override {
    if (error_host_ != nullptr) (void)cudaFreeHost(error_host_);
  }

  const char* name() const override { return "cuda"; }
  bool host_memory() const override { return false; }

  std::unique_ptr<Buffer> Alloc(DType dtype, int64_t size) override {
    ELDR_CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaBuffer>(dtype, size);
  }
  void CopyHostToDevice(void* dst, const void* src, size_t bytes, Stream& s) override {
    if (bytes > 0) ELDR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(s)));
  }
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes, Stream& s) override {
    if (bytes > 0) ELDR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(s)));
  }
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream& s) override {
    if (bytes > 0) ELDR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(s)));
  }
  void MemsetZero(void* dst, size_t bytes, Stream& s) override {
    if (bytes > 0) ELDR_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, S(s)));
  }

  std::unique_ptr<Stream> CreateStream() override {
    ELDR_CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaStream>();
  }
  std::unique_ptr<Event> CreateEvent() override {
    ELDR_CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaEvent>();
  }
  void RecordEvent(Event& e, Stream& s) override { ELDR_CUDA_CHECK(cudaEventRecord(Ev(e), S(s))); }
  void StreamWaitEvent(Stream& s, Event& e) override { ELDR_CUDA_CHECK(cudaStreamWaitEvent(S(s), Ev(e), 0)); }
  void SynchronizeEvent(Event& e) override {
    ELDR_CUDA_CHECK(cudaEventSynchronize(Ev(e)));
    ThrowDeviceErrors();
  }
  void SynchronizeStream(Stream& s) override {
    ELDR_CUDA_CHECK(cudaStreamSynchronize(S(s)));
    ThrowDeviceErrors();
  }

  // ---- implemented over cuda_ops.h ----
  void RmsNorm(const RmsNormParams& p, Stream& s) override {
    cuda::RmsNorm({p.x, p.weight, p.out, p.num_tokens, p.hidden, p.eps}, S(s));
  }
  void ApplyRope(const RopeParams& p, Stream& s) override {
    cuda::ApplyRope({p.q, p.k, p.positions, p.num_tokens, p.num_q_heads, p.num_kv_heads, p.head_dim, p.theta}, S(s));
  }
  void Linear(const LinearParams& p, Stream& s) override {
    cuda::Linear(ctx_,
                 {p.x, Bf16Weights(p.weight, "Linear"), p.y, p.num_tokens, static_cast<int>(p.weight.cols),
                  static_cast<int>(p.weight.rows)},
                 S(s));
  }
  void GateTopK(const GateTopKParams& p, Stream& s) override {
    cuda::GateTopK({p.logits, p.num_tokens, p.num_experts, p.top_k, p.renormalize, p.topk_ids, p.topk_weights}, S(s));
  }
  void Mlp(const MlpParams& p, Stream& s) override {
    cuda::Mlp(ctx_,
              {p.x, Bf16Weights(p.gate_proj, "Mlp"), Bf16Weights(p.up_proj, "Mlp"), Bf16Weights(p.down_proj, "Mlp"),
               p.num_tokens, static_cast<int>(p.gate_proj.cols), static_cast<int>(p.gate_proj.rows), p.out},
              S(s));
  }
  void MoeExperts(const MoeParams& p, Stream& s) override {
    cuda::MoeExperts(
        ctx_, {p.x, p.topk_ids, p.topk_weights, p.num_tokens, p.top_k, &Resident(*p.experts, s), p.out, error_device_},
        S(s));
  }
  void PrefillAttention(const PrefillAttentionParams& p, Stream& s) override {
    cuda::PrefillAttention({p.q, Bf16Cache(p.cache, "PrefillAttention"), p.block_table, p.start, p.num_tokens,
                            p.num_q_heads, p.scale, p.out},
                           S(s));
  }
  void PagedAttentionDecode(const PagedAttentionDecodeParams& p, Stream& s) override {
    cuda::PagedAttentionDecode({p.q, Bf16Cache(p.cache, "PagedAttentionDecode"), p.block_tables, p.context_lens,
                                p.num_seqs, p.num_q_heads, p.max_blocks_per_seq, p.scale, p.out},
                               S(s));
  }

  void EmbeddingGather(const EmbeddingGatherParams& p, Stream& s) override {
    cuda::EmbeddingGather({Bf16Weights(p.table, "EmbeddingGather"), p.table.rows, p.table.cols, p.tokens, p.num_tokens,
                           p.out, error_device_},
                          S(s));
  }
  void ResidualAdd(const ResidualAddParams& p, Stream& s) override { cuda::ResidualAdd({p.x, p.out, p.n}, S(s)); }
  void ArgMax(const ArgMaxParams& p, Stream& s) override { cuda::ArgMax({p.x, p.num_rows, p.num_cols, p.out}, S(s)); }
  void MoeCombine(const MoeCombineParams& p, Stream& s) override {
    cuda::MoeCombine({p.y, p.topk_weights, p.num_tokens, p.top_k, p.hidden, p.out}, S(s));
  }
  void WriteKvSlots(const KvSlotWriteParams& p, Stream& s) override {
    cuda::WriteKvSlots({Bf16Cache(p.cache, "WriteKvSlots"), p.slots, p.k, p.v, p.num_tokens, error_device_}, S(s));
  }
  // packed holds the cache's dtype (bf16 here), as kernels/ops.h says.
  void PackKv(const KvPackParams& p, Stream& s) override {
    cuda::PackKv(
        {Bf16Cache(p.cache, "PackKv"), p.slots, p.num_tokens, static_cast<cuda::Bf16*>(p.packed), false, error_device_},
        S(s));
  }
  void UnpackKv(const KvPackParams& p, Stream& s) override {
    cuda::PackKv({Bf16Cache(p.cache, "UnpackKv"), p.slots, p.num_tokens, static_cast<cuda::Bf16*>(p.packed), true,
                  error_device_},
                 S(s));
  }

  void ReserveScratch(const ScratchShape& sh, Stream& s) override {
    size_t bytes = 0;
    if (sh.max_tokens > 0 && sh.max_in_features > 0) {
      bytes = std::max(bytes, cuda::LinearScratchBytes(sh.max_tokens, sh.max_in_features));
    }
    if (sh.max_tokens > 0 && sh.hidden > 0 && sh.mlp_intermediate > 0) {
      bytes = std::max(bytes, cuda::MlpScratchBytes(sh.max_tokens, sh.hidden, sh.mlp_intermediate));
    }
    if (sh.max_tokens > 0 && sh.hidden > 0 && sh.num_experts > 0 && sh.expert_intermediate > 0) {
      bytes = std::max(
          bytes, cuda::MoeScratchBytes(sh.max_tokens, sh.top_k, sh.num_experts, sh.hidden, sh.expert_intermediate));
    }
    if (bytes > 0) ctx_.Reserve(bytes, S(s));
  }

  // ---- not yet ----
  void ReplayTopK(const ReplayTopKParams&, Stream&) override { NotImplemented("ReplayTopK"); }
  void ExpertFfn(const ExpertFfnParams&, Stream&) override { NotImplemented("ExpertFfn"); }

 private:
  // The device descriptor of `w` with its pointer table resident on the device: uploaded once per descriptor
  // (kernels/backend.h lets a backend key state on a descriptor's address), and again only if the descriptor's
  // pointers changed (a new descriptor at a freed one's address), which a host comparison of 3 * E pointers finds.
  const cuda::ExpertWeights& Resident(const ExpertWeights& w, Stream& s) {
    cuda::ExpertWeights dw;
    dw.num_experts = w.num_experts;
    dw.hidden = w.hidden;
    dw.intermediate = w.intermediate;
    for (int e = 0; e < w.num_experts; ++e) {
      dw.gate_proj.push_back(Bf16Weights(w.gate_proj[e], "MoeExperts"));
      dw.up_proj.push_back(Bf16Weights(w.up_proj[e], "MoeExperts"));
      dw.down_proj.push_back(Bf16Weights(w.down_proj[e], "MoeExperts"));
    }
    ResidentExperts& r = experts_[&w];
    if (r.table != nullptr && r.dw.gate_proj == dw.gate_proj && r.dw.up_proj == dw.up_proj &&
        r.dw.down_proj == dw.down_proj && r.dw.hidden == dw.hidden && r.dw.intermediate == dw.intermediate) {
      return r.dw;
    }
    // The old table (if any) may still be read by MoeExperts kernels in flight (the device schedule does not
    // synchronise): wait for the stream before freeing it. Rare: only when the descriptor's pointers changed.
    if (r.table != nullptr) ELDR_CUDA_CHECK(cudaStreamSynchronize(S(s)));
    static_assert(sizeof(void*) == sizeof(int64_t), "device pointers are stored as kI64");
    r.table = Alloc(DType::kI64, 3 * static_cast<int64_t>(w.num_experts));
    cuda::UploadExpertTable(dw, static_cast<const void**>(r.table->data()), S(s));
    dw.device_table = static_cast<const void* const*>(r.table->data());
    r.dw = std::move(dw);
    return r.dw;
  }

  // The error word's bits since the last check, as one eldr::Error (and cleared).
  void ThrowDeviceErrors() {
    const int bits = *static_cast<volatile int*>(error_host_);
    if (bits == 0) return;
    *error_host_ = 0;
    std::string what;
    if (bits & cuda::kErrorToken) what += "EmbeddingGather: a token id outside [0, vocab)";
    if (bits & cuda::kErrorExpert) {
      what += std::string(what.empty() ? "" : "; ") +
              "MoeExperts: an expert id outside [0, num_experts) or an active expert without weights on this device";
    }
    if (bits & cuda::kErrorSlot) {
      what += std::string(what.empty() ? "" : "; ") +
              "WriteKvSlots/PackKv/UnpackKv: a KV slot outside [0, num_blocks * block_size) (KV block out of range)";
    }
    throw Error(__FILE__, __LINE__, what + " (found on the device; those elements were not written)");
  }

  struct ResidentExperts {
    cuda::ExpertWeights dw;         // device_table points into `table`
    std::unique_ptr<Buffer> table;  // [3, num_experts] device pointers
  };

  cuda::Context ctx_;  // cuBLAS handle and scratch: one stream at a time (cuda_ops.h)
  int device_;
  std::map<const ExpertWeights*, ResidentExperts> experts_;  // by descriptor address (MoeExperts)
  int* error_host_ = nullptr;    // pinned, mapped: the device error word (cuda::DeviceError bits)
  int* error_device_ = nullptr;  // its device address
};

}  // namespace

std::unique_ptr<Backend> MakeCudaBackend(int device) { return std::make_unique<CudaBackendImpl>(device); }

}  // namespace eldr::kernels
