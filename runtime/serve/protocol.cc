#include "runtime/serve/protocol.h"

#include <cstring>
#include <type_traits>

namespace eldr {

namespace {

class Writer {
 public:
  explicit Writer(int tag) { Put<uint8_t>(static_cast<uint8_t>(tag)); }
  template <typename T>
  Writer& Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& PutBool(bool v) { return Put<uint8_t>(v ? 1 : 0); }
  template <typename T>
  Writer& PutVector(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
    return *this;
  }
  Writer& PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  std::vector<uint8_t> Take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads fields in order; the first failure sticks (later reads do nothing, leaving their fields at the
// defaults) and Finish() reports it.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, int tag) : bytes_(bytes), name_(MessageTagName(tag)) {
    uint8_t got = 0;
    if (!Get(&got)) return;
    if (got != tag) {
      Fail(std::string("expected a ") + name_ + " message (tag " + std::to_string(tag) + "), got a " +
           MessageTagName(got) + " message (tag " + std::to_string(got) + ")");
    }
  }
  template <typename T>
  bool Get(T* v) {
    if (!Need(sizeof(T))) return false;
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBool(bool* v) {
    uint8_t b = 0;
    if (!Get(&b)) return false;
    if (b > 1) return Fail("a bool field holds " + std::to_string(b));
    *v = b != 0;
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>* v) {
    uint64_t n = 0;
    if (!Get(&n)) return false;
    if (n > Remaining() / sizeof(T)) return CountTooLarge(n, sizeof(T));
    v->resize(n);
    if (n) std::memcpy(v->data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint64_t n = 0;
    if (!Get(&n)) return false;
    if (n > Remaining()) return CountTooLarge(n, 1);
    s->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Fails unless `n` elements of `element_bytes` fit in the bytes left (for vectors read element by element).
  bool CheckCount(uint64_t n, size_t element_bytes) {
    return ok() && (n <= Remaining() / element_bytes || CountTooLarge(n, element_bytes));
  }
  bool ok() const { return error_.empty(); }
  // The message's status: the first failure, or trailing bytes.
  Status Finish() {
    if (ok() && pos_ != bytes_.size()) Fail(std::to_string(bytes_.size() - pos_) + " trailing bytes");
    return ok() ? Status::Ok() : Status::Corrupt(error_);
  }

 private:
  size_t Remaining() const { return bytes_.size() - pos_; }
  bool Need(size_t n) {
    if (!ok()) return false;
    if (n <= Remaining()) return true;
    return Fail("truncated: needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) + ", has " +
                std::to_string(Remaining()));
  }
  bool CountTooLarge(uint64_t n, size_t element_bytes) {
    return Fail("a count of " + std::to_string(n) + " elements of " + std::to_string(element_bytes) +
                " bytes exceeds the " + std::to_string(Remaining()) + " bytes left");
  }
  bool Fail(const std::string& why) {
    if (!ok()) return false;  // the first failure is the one reported
    error_ = std::string("protocol: ") + name_ + " message of " + std::to_string(bytes_.size()) + " bytes: " + why;
    return false;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  const char* name_;
  std::string error_;
};

// The value of a decoded message, or its reader's error.
template <typename T>
Result<T> Done(Reader& r, T msg) {
  Status st = r.Finish();
  if (!st.ok()) return st;
  return msg;
}

}  // namespace

const char* MessageTagName(int tag) {
  switch (tag) {
    case kTagPrefill:
      return "prefill";
    case kTagCounts:
      return "counts";
    case kTagRoute:
      return "route";
    case kTagKvOffer:
      return "kv offer";
    case kTagKvAccept:
      return "kv accept";
    case kTagKv:
      return "kv";
    case kTagTokens:
      return "tokens";
    case kTagFailed:
      return "failed";
    case kTagShutdown:
      return "shutdown";
    case kTagReady:
      return "ready";
    case kTagHeartbeat:
      return "heartbeat";
    case kTagBye:
      return "bye";
    default:
      return "unknown";
  }
}

std::vector<uint8_t> PrefillRequestMsg::Encode() const { return Writer(kTag).Put(request).Take(); }

Result<PrefillRequestMsg> PrefillRequestMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  PrefillRequestMsg m;
  r.Get(&m.request);
  return Done(r, std::move(m));
}

std::vector<uint8_t> CountsMsg::Encode() const {
  Writer w(kTag);
  w.Put(request).Put(first_token).PutVector(counts).Put(seconds).Put(cpu_seconds).Put(computed_tokens);
  return w.Take();
}

Result<CountsMsg> CountsMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  CountsMsg m;
  r.Get(&m.request);
  r.Get(&m.first_token);
  r.GetVector(&m.counts);
  r.Get(&m.seconds);
  r.Get(&m.cpu_seconds);
  r.Get(&m.computed_tokens);
  return Done(r, std::move(m));
}

std::vector<uint8_t> RouteMsg::Encode() const { return Writer(kTag).Put(request).Put(decoder_rank).Take(); }

Result<RouteMsg> RouteMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  RouteMsg m;
  r.Get(&m.request);
  r.Get(&m.decoder_rank);
  return Done(r, std::move(m));
}

std::vector<uint8_t> KvOfferMsg::Encode() const {
  Writer w(kTag);
  w.Put(request).Put(prompt_len).Put(output_len).Put(first_token).Put(kv_floats).PutVector(replay_ids);
  return w.Take();
}

Result<KvOfferMsg> KvOfferMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  KvOfferMsg m;
  r.Get(&m.request);
  r.Get(&m.prompt_len);
  r.Get(&m.output_len);
  r.Get(&m.first_token);
  r.Get(&m.kv_floats);
  r.GetVector(&m.replay_ids);
  return Done(r, std::move(m));
}

std::vector<uint8_t> KvAcceptMsg::Encode() const { return Writer(kTag).Put(request).PutBool(accepted).Take(); }

Result<KvAcceptMsg> KvAcceptMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  KvAcceptMsg m;
  r.Get(&m.request);
  r.GetBool(&m.accepted);
  return Done(r, std::move(m));
}

std::vector<uint8_t> KvMsg::Encode() const {
  Writer w(kTag);
  w.Put(request).PutBool(kv_inline);
  if (kv_inline) {
    w.PutVector(kv);
  } else {
    w.Put(kv_floats);
  }
  w.Put(kv_checksum);
  return w.Take();
}

Result<KvMsg> KvMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  KvMsg m;
  r.Get(&m.request);
  r.GetBool(&m.kv_inline);
  if (m.kv_inline) {
    r.GetVector(&m.kv);
    m.kv_floats = m.kv.size();
  } else {
    r.Get(&m.kv_floats);
  }
  r.Get(&m.kv_checksum);
  return Done(r, std::move(m));
}

uint64_t KvChecksum(const std::vector<float>& kv) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = reinterpret_cast<const uint8_t*>(kv.data());
  for (size_t i = 0; i < kv.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::vector<uint8_t> TokensMsg::Encode() const {
  Writer w(kTag);
  w.Put(batch).Put(distinct_experts).Put(context_tokens).Put(seconds).Put(cpu_seconds);
  w.Put<uint64_t>(tokens.size());
  for (const TokenRecord& t : tokens) w.Put(t.request).Put(t.index).Put(t.token).PutBool(t.finished);
  w.PutVector(rank_load).Put(balancedness);
  return w.Take();
}

Result<TokensMsg> TokensMsg::Decode(std::span<const uint8_t> bytes) {
  constexpr size_t kTokenBytes = sizeof(int64_t) * 2 + sizeof(int32_t) + 1;
  Reader r(bytes, kTag);
  TokensMsg m;
  uint64_t n = 0;
  r.Get(&m.batch);
  r.Get(&m.distinct_experts);
  r.Get(&m.context_tokens);
  r.Get(&m.seconds);
  r.Get(&m.cpu_seconds);
  r.Get(&n);
  r.CheckCount(n, kTokenBytes);
  if (r.ok()) m.tokens.resize(n);
  for (TokenRecord& t : m.tokens) {
    r.Get(&t.request);
    r.Get(&t.index);
    r.Get(&t.token);
    r.GetBool(&t.finished);
  }
  r.GetVector(&m.rank_load);
  r.Get(&m.balancedness);
  return Done(r, std::move(m));
}

std::vector<uint8_t> FailedMsg::Encode() const { return Writer(kTag).Put(request).PutString(reason).Take(); }

Result<FailedMsg> FailedMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  FailedMsg m;
  r.Get(&m.request);
  r.GetString(&m.reason);
  return Done(r, std::move(m));
}

std::vector<uint8_t> ShutdownMsg::Encode() const { return Writer(kTag).PutBool(job_failed).Take(); }

Result<ShutdownMsg> ShutdownMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  ShutdownMsg m;
  r.GetBool(&m.job_failed);
  return Done(r, std::move(m));
}

std::vector<uint8_t> ReadyMsg::Encode() const { return Writer(kTag).Take(); }

Result<ReadyMsg> ReadyMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  return Done(r, ReadyMsg{});
}

std::vector<uint8_t> HeartbeatMsg::Encode() const { return Writer(kTag).Put(signal).Take(); }

Result<HeartbeatMsg> HeartbeatMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  HeartbeatMsg m;
  r.Get(&m.signal);
  return Done(r, std::move(m));
}

std::vector<uint8_t> ByeMsg::Encode() const { return Writer(kTag).Take(); }

Result<ByeMsg> ByeMsg::Decode(std::span<const uint8_t> bytes) {
  Reader r(bytes, kTag);
  return Done(r, ByeMsg{});
}

}  // namespace eldr
