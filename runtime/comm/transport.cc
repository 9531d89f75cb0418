#include "runtime/comm/transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <utility>

#include "runtime/common/check.h"

namespace eldr {

namespace {
constexpr size_t kMaxChunk = size_t{1} << 30;  // stay well inside MPI's int counts

// Polls until every request completes, calling on_wait (when set) between polls; sleeps 20 µs, then 200 µs after
// 100 polls, so a long wait costs little CPU.
void WaitAllPolling(int count, MPI_Request* requests, const std::function<void()>& on_wait) {
  int done = 0;
  for (int idle = 0;; ++idle) {
    ELDR_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    if (on_wait) on_wait();
    std::this_thread::sleep_for(std::chrono::microseconds(idle < 100 ? 20 : 200));
  }
}
}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  ELDR_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ELDR_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  posted_.resize(static_cast<size_t>(size_));
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || num_posted_ == 0) return;
  // A little time for the last posted sends (a failed job's shutdown messages) to reach live receivers.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  for (Progress(); num_posted_ > 0 && std::chrono::steady_clock::now() < until; Progress()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto& queue : posted_) {
    for (auto& send : queue) {
      for (MPI_Request& r : send->requests) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
      (void)send.release();  // MPI may still read the bytes of a send it has not completed
    }
  }
}

void MpiTransport::Post(int dest, int tag, std::vector<uint8_t> bytes) {
  auto send = std::make_unique<PostedSend>();
  send->total = bytes.size();
  send->bytes = std::move(bytes);
  send->requests.emplace_back();
  ELDR_MPI_CHECK(MPI_Isend(&send->total, 1, MPI_UINT64_T, dest, tag, comm_, &send->requests.back()));
  for (size_t off = 0; off < send->bytes.size(); off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, send->bytes.size() - off));
    send->requests.emplace_back();
    ELDR_MPI_CHECK(MPI_Isend(send->bytes.data() + off, n, MPI_BYTE, dest, tag, comm_, &send->requests.back()));
  }
  auto& queue = posted_.at(static_cast<size_t>(dest));
  if (queue.empty()) busy_dests_.push_back(dest);
  queue.push_back(std::move(send));
  ++num_posted_;
  Progress();
}

size_t MpiTransport::posted() {
  Progress();
  return num_posted_;
}

void MpiTransport::Progress() {
  for (size_t i = 0; i < busy_dests_.size();) {
    auto& queue = posted_[static_cast<size_t>(busy_dests_[i])];
    while (!queue.empty()) {
      int done = 0;
      PostedSend& front = *queue.front();
      ELDR_MPI_CHECK(
          MPI_Testall(static_cast<int>(front.requests.size()), front.requests.data(), &done, MPI_STATUSES_IGNORE));
      if (!done) break;
      queue.pop_front();
      --num_posted_;
    }
    if (queue.empty()) {
      busy_dests_[i] = busy_dests_.back();
      busy_dests_.pop_back();
    } else {
      ++i;
    }
  }
}

// Fault injection for tests/mpi/fault_test.sh: ELDR_FAULT_STOP_MID_SEND_RANK=r makes rank r stop itself (SIGSTOP)
// between the header and the payload of its 50th message to rank 0, as a SIGSTOP landing there would.
static void MaybeStopMidSend(int rank, int dest, size_t bytes) {
  static const char* const v = std::getenv("ELDR_FAULT_STOP_MID_SEND_RANK");  // read once: Send is a hot path
  static int sends_to_0 = 0;                                                  // fault injection only
  if (v == nullptr || *v == '\0' || std::atoi(v) != rank || dest != 0 || bytes == 0) return;
  if (++sends_to_0 == 50) std::raise(SIGSTOP);
}

void MpiTransport::Send(int dest, int tag, const void* data, size_t bytes) {
  // Header: the total size, then the chunks (one message when it fits).
  uint64_t total = bytes;
  ELDR_MPI_CHECK(MPI_Send(&total, 1, MPI_UINT64_T, dest, tag, comm_));
  MaybeStopMidSend(rank_, dest, bytes);
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
    ELDR_MPI_CHECK(MPI_Send(p + off, n, MPI_BYTE, dest, tag, comm_));
  }
}

void MpiTransport::SendPolling(int dest, int tag, const void* data, size_t bytes,
                               const std::function<void()>& on_wait) {
  // The same messages as Send (the header, then the chunks), posted at once: MPI keeps their order.
  const uint64_t total = bytes;
  std::vector<MPI_Request> requests(1);
  ELDR_MPI_CHECK(MPI_Isend(&total, 1, MPI_UINT64_T, dest, tag, comm_, &requests[0]));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
    requests.emplace_back();
    ELDR_MPI_CHECK(MPI_Isend(p + off, n, MPI_BYTE, dest, tag, comm_, &requests.back()));
  }
  WaitAllPolling(static_cast<int>(requests.size()), requests.data(), on_wait);
}

Message MpiTransport::Recv(int source, int tag) { return Receive(source, tag, nullptr); }

Message MpiTransport::RecvPolling(int source, int tag, const std::function<void()>& on_wait) {
  return Receive(source, tag, &on_wait);
}

Message MpiTransport::Receive(int source, int tag, const std::function<void()>* on_wait) {
  MPI_Status st;
  uint64_t total = 0;
  ELDR_MPI_CHECK(MPI_Recv(&total, 1, MPI_UINT64_T, source == kAnySource ? MPI_ANY_SOURCE : source,
                          tag == kAnyTag ? MPI_ANY_TAG : tag, comm_, &st));
  Message m;
  m.source = st.MPI_SOURCE;
  m.tag = st.MPI_TAG;
  m.payload.resize(total);
  if (!on_wait) {
    for (size_t off = 0; off < total; off += kMaxChunk) {
      const int n = static_cast<int>(std::min<size_t>(kMaxChunk, total - off));
      ELDR_MPI_CHECK(MPI_Recv(m.payload.data() + off, n, MPI_BYTE, m.source, m.tag, comm_, MPI_STATUS_IGNORE));
    }
    return m;
  }
  // The chunks posted at once (MPI matches them in order, as the sender posted them), then polled.
  std::vector<MPI_Request> requests;
  for (size_t off = 0; off < total; off += kMaxChunk) {
    const int n = static_cast<int>(std::min<size_t>(kMaxChunk, total - off));
    requests.emplace_back();
    ELDR_MPI_CHECK(MPI_Irecv(m.payload.data() + off, n, MPI_BYTE, m.source, m.tag, comm_, &requests.back()));
  }
  try {
    WaitAllPolling(static_cast<int>(requests.size()), requests.data(), *on_wait);
  } catch (...) {  // on_wait gave up: MPI may still write into the payload, which is therefore never freed
    for (MPI_Request& r : requests) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    (void)new std::vector<uint8_t>(std::move(m.payload));
    throw;
  }
  return m;
}

bool MpiTransport::Poll(int source, int tag) {
  Progress();
  int flag = 0;
  ELDR_MPI_CHECK(MPI_Iprobe(source == kAnySource ? MPI_ANY_SOURCE : source, tag == kAnyTag ? MPI_ANY_TAG : tag, comm_,
                            &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

GroupComm GroupComm::Split(MPI_Comm parent, int color, int key) {
  GroupComm g;
  ELDR_MPI_CHECK(MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &g.comm_));
  if (g.comm_ != MPI_COMM_NULL) {
    ELDR_MPI_CHECK(MPI_Comm_rank(g.comm_, &g.rank_));
    ELDR_MPI_CHECK(MPI_Comm_size(g.comm_, &g.size_));
  }
  return g;
}

GroupComm::~GroupComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

GroupComm::GroupComm(GroupComm&& o) noexcept
    : comm_(o.comm_), rank_(o.rank_), size_(o.size_), wait_hook_(std::move(o.wait_hook_)) {
  o.comm_ = MPI_COMM_NULL;
}

GroupComm& GroupComm::operator=(GroupComm&& o) noexcept {
  if (this != &o) {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(wait_hook_, o.wait_hook_);
  }
  return *this;
}

void GroupComm::Wait(MPI_Request request) { WaitAllPolling(1, &request, wait_hook_); }

void GroupComm::Bcast(void* data, size_t bytes, int root) {
  ELDR_CHECK(valid(), "Bcast on a rank outside the group");
  ELDR_CHECK(bytes <= static_cast<size_t>(INT_MAX), "Bcast of " << bytes << " bytes");
  MPI_Request request;
  ELDR_MPI_CHECK(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &request));
  Wait(request);
}

void GroupComm::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                          const std::vector<int64_t>& send_offsets, void* recv, const std::vector<int64_t>& recv_bytes,
                          const std::vector<int64_t>& recv_offsets) {
  ELDR_CHECK(valid(), "Alltoallv on a rank outside the group");
  const size_t n = static_cast<size_t>(size_);
  ELDR_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
             "Alltoallv needs one count and offset per rank of the group (" << n << ")");
  auto to_int = [](const std::vector<int64_t>& v) {
    std::vector<int> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      ELDR_CHECK(v[i] >= 0 && v[i] <= INT_MAX, "Alltoallv count or offset " << v[i] << " outside [0, 2^31)");
      out[i] = static_cast<int>(v[i]);
    }
    return out;
  };
  const std::vector<int> sc = to_int(send_bytes), so = to_int(send_offsets), rc = to_int(recv_bytes),
                         ro = to_int(recv_offsets);
  MPI_Request request;
  ELDR_MPI_CHECK(
      MPI_Ialltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(), MPI_BYTE, comm_, &request));
  Wait(request);
}

void Wire::Need(uint64_t n) const {
  ELDR_CHECK(pos_ + n <= buf_.size(),
             "short message: need " << n << " bytes at offset " << pos_ << " of " << buf_.size());
}

}  // namespace eldr
