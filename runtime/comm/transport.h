// Point-to-point messages between the ranks of a job (DESIGN.md §2, §6). The control plane (requests,
// counts, routing decisions, tokens) always goes over MPI; KV blocks go over a Transport too: MPI on CPU,
// NCCL when built with CUDA and run on GPUs. Bootstrap (MPI_Init, the communicator) is kept apart from the
// data plane: a Transport is handed an initialised communicator.
//
// Thread safety: one thread per process uses a Transport (MPI_THREAD_FUNNELED).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/check.h"
#include "runtime/common/status.h"

namespace eldr {

// Unrecoverable MPI failures throw eldr::Error with file, line and rank (STYLE.md).
#define ELDR_MPI_CHECK(call)                                                                   \
  do {                                                                                         \
    int eldr_mpi_rc_ = (call);                                                                 \
    if (eldr_mpi_rc_ != MPI_SUCCESS) {                                                         \
      char eldr_mpi_msg_[MPI_MAX_ERROR_STRING];                                                \
      int eldr_mpi_len_ = 0;                                                                   \
      MPI_Error_string(eldr_mpi_rc_, eldr_mpi_msg_, &eldr_mpi_len_);                           \
      throw ::eldr::Error(__FILE__, __LINE__, std::string(#call " failed: ") + eldr_mpi_msg_); \
    }                                                                                          \
  } while (0)

struct Message {
  int source = -1;
  int tag = -1;
  std::vector<uint8_t> payload;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // Blocking send of `bytes` bytes to `dest`.
  virtual void Send(int dest, int tag, const void* data, size_t bytes) = 0;
  // As Send, but calls on_wait() between polls until the send has completed: a large message waits for its
  // receiver (a stopped or dead one forever), and the serving job answers rank 0's heartbeats meanwhile.
  // Default: Send (on_wait never called).
  virtual void SendPolling(int dest, int tag, const void* data, size_t bytes, const std::function<void()>& on_wait) {
    (void)on_wait;
    Send(dest, tag, data, bytes);
  }
  // Blocking receive from `source` (kAnySource) with `tag` (kAnyTag).
  virtual Message Recv(int source, int tag) = 0;
  // As Recv, but calls on_wait() between polls while the message's payload is on its way: a sender that stops
  // or dies between a message's header and the end of its payload (a large KvMsg) would keep Recv waiting
  // forever, and the serving job answers rank 0's heartbeats meanwhile, so the sender is the rank named.
  // on_wait may throw to give up on the message (the job is ending): its pending receives are cancelled, their
  // buffer is left to MPI (never freed), and the exception propagates. Default: Recv (on_wait never called).
  virtual Message RecvPolling(int source, int tag, const std::function<void()>& on_wait) {
    (void)on_wait;
    return Recv(source, tag);
  }
  // Non-blocking: whether a matching message is waiting.
  virtual bool Poll(int source, int tag) = 0;
  // A send that never blocks: the bytes are copied and the send left to complete in the background, in order with
  // every other send to `dest` (a receiver that stops draining, stopped or dead, holds up only its own messages:
  // rank 0 keeps routing, answering and watching). Default: Send.
  virtual void Post(int dest, int tag, std::vector<uint8_t> bytes) { Send(dest, tag, bytes.data(), bytes.size()); }
  // Posted sends not yet taken by their receivers (their copies are freed as they complete). Default: 0.
  virtual size_t posted() { return 0; }

  static constexpr int kAnySource = -1;
  static constexpr int kAnyTag = -1;
};

// MPI implementation over a communicator (MPI_COMM_WORLD by default). Messages larger than 2 GiB are sent
// in chunks.
class MpiTransport : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  void Send(int dest, int tag, const void* data, size_t bytes) override;
  // MPI_Isend of the header and chunks, MPI_Testall with short sleeps (20 µs, then 200 µs after 100 polls).
  void SendPolling(int dest, int tag, const void* data, size_t bytes, const std::function<void()>& on_wait) override;
  Message Recv(int source, int tag) override;
  // The header by a blocking MPI_Recv, then MPI_Irecv of the chunks and MPI_Testall with short sleeps (as
  // SendPolling).
  Message RecvPolling(int source, int tag, const std::function<void()>& on_wait) override;
  // MPI_Iprobe; also completes the posted sends their receivers took (Progress).
  bool Poll(int source, int tag) override;
  // MPI_Isend of the header and chunks of a copy, kept in a queue per destination until MPI_Test says it is sent.
  void Post(int dest, int tag, std::vector<uint8_t> bytes) override;
  size_t posted() override;
  // Sends still posted at destruction are released to MPI (MPI_Request_free) with their copies, which stay
  // allocated: MPI may still read them.
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;
  MPI_Comm comm() const { return comm_; }

 private:
  struct PostedSend {
    uint64_t total = 0;  // the header, sent from here
    std::vector<uint8_t> bytes;
    std::vector<MPI_Request> requests;
  };
  Message Receive(int source, int tag, const std::function<void()>* on_wait);
  // Frees each busy destination's leading posted sends that have completed (at most one pending test per
  // destination: sends to one receiver complete in order, so a blocked receiver costs one MPI_Testall per call).
  void Progress();
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<std::deque<std::unique_ptr<PostedSend>>> posted_;  // [size] per destination, oldest first
  std::vector<int> busy_dests_;                                  // the destinations with posted sends
  size_t num_posted_ = 0;
};

// The ranks of one expert-parallel (EP) decode group (DESIGN.md §2): a sub-communicator of the job, so that
// the group's collectives (the leader's per-layer dispatch and the combine) never involve rank 0 or the
// prefill ranks. Rank 0 of the group is the leader. CPU/MPI only: an NCCL group for GPU builds is not
// implemented (the decode executor runs on the CPU reference kernels).
//
// Waiting: a rank blocked in a collective of Open MPI spins a core; with more ranks than cores (tests, the
// demo) that steals the workers' time. So every collective here is the non-blocking MPI call, completed by
// polling with short sleeps (20 µs, then 200 µs after 100 idle polls).
//
// Thread safety: one thread per process (MPI_THREAD_FUNNELED). Every member of the group must make the same
// sequence of collective calls.
class GroupComm {
 public:
  // Collective over `parent`: ranks with the same color >= 0 form a group, ordered by key; color < 0 (or
  // MPI_UNDEFINED) joins none and gets an invalid GroupComm (valid() false).
  static GroupComm Split(MPI_Comm parent, int color, int key);
  GroupComm() = default;
  ~GroupComm();
  GroupComm(GroupComm&& o) noexcept;
  GroupComm& operator=(GroupComm&& o) noexcept;
  GroupComm(const GroupComm&) = delete;
  GroupComm& operator=(const GroupComm&) = delete;

  bool valid() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Called on every poll while a collective of this group waits (on the calling thread, between MPI_Test calls):
  // the serving job answers rank 0's heartbeats there, so a rank blocked on a stopped or dead group member
  // stays heard from and the silent member is the one named. Empty: none.
  void SetWaitHook(std::function<void()> hook) { wait_hook_ = std::move(hook); }

  // Broadcast of `bytes` bytes from group rank `root` (MPI_Ibcast + polling).
  void Bcast(void* data, size_t bytes, int root);
  // Personalised all-to-all of bytes: this rank sends send_bytes[r] bytes from send + send_offsets[r] to rank
  // r and receives recv_bytes[r] bytes from rank r at recv + recv_offsets[r] (MPI_Ialltoallv + polling).
  // Every vector has size() entries; counts and offsets must fit in an int (< 2 GiB per call).
  void Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& send_offsets,
                 void* recv, const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets);

 private:
  void Wait(MPI_Request request);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0;
  std::function<void()> wait_hook_;
};

// A plain byte buffer for composing and parsing messages (little-endian host order; all ranks of a job run
// the same binary on the same architecture).
class Wire {
 public:
  Wire() = default;
  explicit Wire(std::vector<uint8_t> bytes) : buf_(std::move(bytes)) {}
  template <typename T>
  Wire& Put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
    return *this;
  }
  template <typename T>
  Wire& PutVector(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
    return *this;
  }
  Wire& PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  template <typename T>
  T Get() {
    T v;
    Need(sizeof(T));
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const uint64_t n = Get<uint64_t>();
    Need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), buf_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  std::string GetString() {
    const uint64_t n = Get<uint64_t>();
    Need(n);
    std::string s(reinterpret_cast<const char*>(buf_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }

 private:
  void Need(uint64_t n) const;  // throws eldr::Error on a short message (a protocol bug)
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
};

}  // namespace eldr
