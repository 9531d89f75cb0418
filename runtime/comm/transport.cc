#include "runtime/comm/transport.h"

#include <algorithm>
#include <climits>

#include "runtime/common/check.h"

namespace eldr {

namespace {
constexpr size_t kMaxChunk = size_t{1} << 30;  // stay well inside MPI's int counts
}

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  ELDR_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ELDR_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void MpiTransport::Send(int dest, int tag, const void* data, size_t bytes) {
  // Header: the total size, then the chunks (one message when it fits).
  uint64_t total = bytes;
  ELDR_MPI_CHECK(MPI_Send(&total, 1, MPI_UINT64_T, dest, tag, comm_));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
    ELDR_MPI_CHECK(MPI_Send(p + off, n, MPI_BYTE, dest, tag, comm_));
  }
}

Message MpiTransport::Recv(int source, int tag) {
  MPI_Status st;
  uint64_t total = 0;
  ELDR_MPI_CHECK(MPI_Recv(&total, 1, MPI_UINT64_T, source == kAnySource ? MPI_ANY_SOURCE : source,
                          tag == kAnyTag ? MPI_ANY_TAG : tag, comm_, &st));
  Message m;
  m.source = st.MPI_SOURCE;
  m.tag = st.MPI_TAG;
  m.payload.resize(total);
  for (size_t off = 0; off < total; off += kMaxChunk) {
    const int n = static_cast<int>(std::min<size_t>(kMaxChunk, total - off));
    ELDR_MPI_CHECK(MPI_Recv(m.payload.data() + off, n, MPI_BYTE, m.source, m.tag, comm_, MPI_STATUS_IGNORE));
  }
  return m;
}

bool MpiTransport::Poll(int source, int tag) {
  int flag = 0;
  ELDR_MPI_CHECK(MPI_Iprobe(source == kAnySource ? MPI_ANY_SOURCE : source, tag == kAnyTag ? MPI_ANY_TAG : tag, comm_,
                            &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

void Wire::Need(uint64_t n) const {
  ELDR_CHECK(pos_ + n <= buf_.size(), "short message: need " << n << " bytes at offset " << pos_ << " of "
                                                             << buf_.size());
}

}  // namespace eldr
