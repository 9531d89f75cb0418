// The serve job's messages (runtime/serve/protocol.h): every message survives a round trip field for field, and
// every malformed payload — each truncation, a count larger than the bytes that follow, trailing bytes, a bad
// bool, garbage, the wrong tag — decodes to Status::Corrupt, never a crash or a read past the buffer (run under
// valgrind or ASan to see the latter).
#include "runtime/serve/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

namespace eldr {
namespace {

CountsMsg SampleCounts() { return {7, 42, {0.f, 1.f, 2.5f, -3.f}, 0.25, 0.125, 11}; }

KvOfferMsg SampleOffer() {
  KvOfferMsg m;
  m.request = 3;
  m.prompt_len = 2;
  m.output_len = 5;
  m.first_token = 9;
  m.kv_floats = 6;
  m.replay_ids = {1, 2, 3, 65535};
  return m;
}

KvMsg SampleKv(bool kv_inline) {
  KvMsg m;
  m.request = 3;
  m.kv_inline = kv_inline;
  if (kv_inline) m.kv = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  m.kv_floats = 6;
  m.kv_checksum = KvChecksum({1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  return m;
}

TokensMsg SampleTokens() {
  TokensMsg m;
  m.batch = 2;
  m.distinct_experts = 13;
  m.context_tokens = 40;
  m.seconds = 0.01;
  m.cpu_seconds = 0.02;
  m.tokens = {{5, 1, 100, false}, {6, 3, 200, true}};
  m.rank_load = {4, 6};
  m.balancedness = 0.8;
  return m;
}

// Every prefix of a valid message is a truncated one; each must fail cleanly.
template <typename Msg>
void ExpectEveryTruncationFails(const Msg& m) {
  const std::vector<uint8_t> bytes = m.Encode();
  for (size_t n = 0; n < bytes.size(); ++n) {
    // A heap copy of exactly n bytes: an over-read is caught by valgrind/ASan.
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = Msg::Decode(cut);
    ASSERT_FALSE(r.ok()) << MessageTagName(Msg::kTag) << " truncated to " << n << " bytes decoded";
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("protocol: "), std::string::npos) << r.status().message();
  }
}

template <typename Msg>
void ExpectTrailingBytesFail(const Msg& m) {
  std::vector<uint8_t> bytes = m.Encode();
  bytes.push_back(0);
  auto r = Msg::Decode(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 trailing bytes"), std::string::npos) << r.status().message();
}

TEST(Protocol, EveryMessageRoundTrips) {
  auto prefill = PrefillRequestMsg::Decode(PrefillRequestMsg{123456789012LL}.Encode());
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  EXPECT_EQ(prefill->request, 123456789012LL);

  const CountsMsg c = SampleCounts();
  auto counts = CountsMsg::Decode(c.Encode());
  ASSERT_TRUE(counts.ok()) << counts.status().ToString();
  EXPECT_EQ(counts->request, 7);
  EXPECT_EQ(counts->first_token, 42);
  EXPECT_EQ(counts->counts, c.counts);
  EXPECT_EQ(counts->seconds, 0.25);
  EXPECT_EQ(counts->cpu_seconds, 0.125);
  EXPECT_EQ(counts->computed_tokens, 11);

  auto route = RouteMsg::Decode(RouteMsg{8, 5}.Encode());
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->request, 8);
  EXPECT_EQ(route->decoder_rank, 5);

  auto failed = FailedMsg::Decode(FailedMsg{4, "prompt of 99 tokens exceeds the prefill KV cache"}.Encode());
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->request, 4);
  EXPECT_EQ(failed->reason, "prompt of 99 tokens exceeds the prefill KV cache");

  EXPECT_TRUE(ShutdownMsg::Decode(ShutdownMsg{}.Encode()).ok());
  EXPECT_TRUE(ReadyMsg::Decode(ReadyMsg{}.Encode()).ok());
  EXPECT_EQ(ShutdownMsg{}.Encode(), (std::vector<uint8_t>{kTagShutdown, 0}));  // the tag byte, job_failed
  auto failed_job = ShutdownMsg::Decode(ShutdownMsg{true}.Encode());
  ASSERT_TRUE(failed_job.ok());
  EXPECT_TRUE(failed_job->job_failed);
  EXPECT_TRUE(HeartbeatMsg::Decode(HeartbeatMsg{}.Encode()).ok());
  EXPECT_TRUE(ByeMsg::Decode(ByeMsg{}.Encode()).ok());
  // The tag byte, then the signal as a little-endian int32 (15: SIGTERM).
  EXPECT_EQ(HeartbeatMsg{15}.Encode(), (std::vector<uint8_t>{kTagHeartbeat, 15, 0, 0, 0}));
  auto pong = HeartbeatMsg::Decode(HeartbeatMsg{2}.Encode());
  ASSERT_TRUE(pong.ok());
  EXPECT_EQ(pong->signal, 2);
  EXPECT_EQ(ByeMsg{}.Encode(), std::vector<uint8_t>{kTagBye});
  EXPECT_FALSE(ByeMsg::Decode(HeartbeatMsg{}.Encode()).ok());
  EXPECT_STREQ(MessageTagName(kTagHeartbeat), "heartbeat");
  EXPECT_STREQ(MessageTagName(kTagBye), "bye");
}

TEST(Protocol, KvHandoffRoundTrips) {
  const KvOfferMsg o = SampleOffer();
  auto ro = KvOfferMsg::Decode(o.Encode());
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  EXPECT_EQ(ro->request, 3);
  EXPECT_EQ(ro->prompt_len, 2);
  EXPECT_EQ(ro->output_len, 5);
  EXPECT_EQ(ro->first_token, 9);
  EXPECT_EQ(ro->kv_floats, 6u);
  EXPECT_EQ(ro->replay_ids, o.replay_ids);
  // The offer carries no KV: 1 + 3·8 + 4 + 8 (kv_floats) + (8 + 4·2) bytes.
  EXPECT_EQ(o.Encode().size(), 1u + 24 + 4 + 8 + 8 + 8);
  for (bool accepted : {true, false}) {
    auto ra = KvAcceptMsg::Decode(KvAcceptMsg{41, accepted}.Encode());
    ASSERT_TRUE(ra.ok());
    EXPECT_EQ(ra->request, 41);
    EXPECT_EQ(ra->accepted, accepted);
  }
  EXPECT_EQ((KvAcceptMsg{41, true}.Encode().size()), 1u + 8 + 1);
  for (bool kv_inline : {true, false}) {
    const KvMsg m = SampleKv(kv_inline);
    auto r = KvMsg::Decode(m.Encode());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->request, 3);
    EXPECT_EQ(r->kv_inline, kv_inline);
    EXPECT_EQ(r->kv, m.kv);
    EXPECT_EQ(r->kv_floats, 6u);
    EXPECT_EQ(r->kv_checksum, m.kv_checksum);
  }
  // Inline: 1 + 8 + 1 + (8 + 6·4) + 8 bytes; not inline, the floats are not in the message: 1 + 8 + 1 + 8 + 8.
  EXPECT_EQ(SampleKv(true).Encode().size(), 1u + 8 + 1 + 8 + 24 + 8);
  EXPECT_EQ(SampleKv(false).Encode().size(), 1u + 8 + 1 + 8 + 8);
  EXPECT_STREQ(MessageTagName(kTagKvOffer), "kv offer");
  EXPECT_STREQ(MessageTagName(kTagKvAccept), "kv accept");
  EXPECT_FALSE(KvMsg::Decode(o.Encode()).ok());  // an offer is not the KV
}

TEST(Protocol, TokensRoundTrip) {
  const TokensMsg m = SampleTokens();
  auto r = TokensMsg::Decode(m.Encode());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->batch, 2);
  EXPECT_EQ(r->distinct_experts, 13);
  EXPECT_EQ(r->context_tokens, 40);
  EXPECT_EQ(r->seconds, 0.01);
  EXPECT_EQ(r->cpu_seconds, 0.02);
  EXPECT_EQ(r->tokens, m.tokens);
  EXPECT_EQ(r->rank_load, m.rank_load);
  EXPECT_EQ(r->balancedness, 0.8);
  auto empty = TokensMsg::Decode(TokensMsg{}.Encode());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->tokens.empty());
}

TEST(Protocol, TruncatedMessagesFail) {
  ExpectEveryTruncationFails(PrefillRequestMsg{1});
  ExpectEveryTruncationFails(SampleCounts());
  ExpectEveryTruncationFails(RouteMsg{1, 2});
  ExpectEveryTruncationFails(SampleKv(true));
  ExpectEveryTruncationFails(SampleKv(false));
  ExpectEveryTruncationFails(SampleOffer());
  ExpectEveryTruncationFails(KvAcceptMsg{1, false});
  ExpectEveryTruncationFails(SampleTokens());
  ExpectEveryTruncationFails(FailedMsg{1, "why"});
  ExpectEveryTruncationFails(ShutdownMsg{true});
  ExpectEveryTruncationFails(ReadyMsg{});
  auto r = RouteMsg::Decode(std::vector<uint8_t>{kTagRoute, 1, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "protocol: route message of 3 bytes: truncated: needs 8 bytes at offset 1, has 2");
}

TEST(Protocol, TrailingBytesFail) {
  ExpectTrailingBytesFail(PrefillRequestMsg{1});
  ExpectTrailingBytesFail(SampleCounts());
  ExpectTrailingBytesFail(RouteMsg{1, 2});
  ExpectTrailingBytesFail(SampleKv(true));
  ExpectTrailingBytesFail(SampleOffer());
  ExpectTrailingBytesFail(KvAcceptMsg{1, true});
  ExpectTrailingBytesFail(SampleTokens());
  ExpectTrailingBytesFail(FailedMsg{1, "why"});
  ExpectTrailingBytesFail(ShutdownMsg{});
  ExpectTrailingBytesFail(ReadyMsg{});
  ExpectTrailingBytesFail(HeartbeatMsg{});
  ExpectTrailingBytesFail(ByeMsg{});
}

// Overwrites the uint64 count at `offset` of an encoded message.
std::vector<uint8_t> WithCount(std::vector<uint8_t> bytes, size_t offset, uint64_t count) {
  std::memcpy(bytes.data() + offset, &count, sizeof(count));
  return bytes;
}

TEST(Protocol, OversizedCountsFailWithoutAllocating) {
  // CountsMsg: tag (1) + request (8) + first_token (4), then the counts' element count.
  const size_t counts_at = 1 + 8 + 4;
  for (uint64_t n : {uint64_t{5}, uint64_t{1} << 40, std::numeric_limits<uint64_t>::max(),
                     std::numeric_limits<uint64_t>::max() / 4 + 1}) {
    auto r = CountsMsg::Decode(WithCount(SampleCounts().Encode(), counts_at, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    if (n > 5) {
      EXPECT_NE(r.status().message().find("exceeds the"), std::string::npos) << r.status().message();
    }
  }
  // TokensMsg: tag + batch (4) + distinct (8) + context (8) + seconds (8) + cpu (8), then the token count.
  auto tokens = TokensMsg::Decode(WithCount(SampleTokens().Encode(), 1 + 4 + 8 + 8 + 8 + 8, uint64_t{1} << 62));
  ASSERT_FALSE(tokens.ok());
  EXPECT_NE(tokens.status().message().find("a count of 4611686018427387904 elements of 21 bytes exceeds"),
            std::string::npos)
      << tokens.status().message();
  // FailedMsg: tag + request, then the string's length.
  auto failed = FailedMsg::Decode(WithCount(FailedMsg{1, "why"}.Encode(), 9, 1000));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("exceeds the 3 bytes left"), std::string::npos);
}

TEST(Protocol, WrongTagFails) {
  auto r = CountsMsg::Decode(SampleTokens().Encode());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("expected a counts message (tag 2), got a tokens message (tag 5)"),
            std::string::npos)
      << r.status().message();
  auto unknown = RouteMsg::Decode(std::vector<uint8_t>{200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("got a unknown message (tag 200)"), std::string::npos);
  EXPECT_FALSE(ReadyMsg::Decode(ShutdownMsg{}.Encode()).ok());
  EXPECT_FALSE(ShutdownMsg::Decode(std::span<const uint8_t>()).ok());
}

TEST(Protocol, BadBoolFails) {
  std::vector<uint8_t> bytes = SampleKv(true).Encode();
  bytes[1 + 8] = 2;  // kv_inline
  auto r = KvMsg::Decode(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a bool field holds 2"), std::string::npos) << r.status().message();
}

// Random bytes after a right tag byte, and random corruptions of valid messages: a status, never a crash.
TEST(Protocol, GarbageNeverCrashes) {
  std::mt19937_64 rng(11);
  const std::vector<std::vector<uint8_t>> valid = {
      SampleCounts().Encode(),     SampleKv(true).Encode(), SampleKv(false).Encode(),     SampleTokens().Encode(),
      FailedMsg{2, "no"}.Encode(), SampleOffer().Encode(),  KvAcceptMsg{3, true}.Encode()};
  int decoded = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<uint8_t> bytes;
    if (trial % 2 == 0) {
      bytes.resize(rng() % 96);
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      if (!bytes.empty()) bytes[0] = static_cast<uint8_t>(1 + rng() % 12);
    } else {
      bytes = valid[rng() % valid.size()];
      for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    }
    decoded += PrefillRequestMsg::Decode(bytes).ok() + CountsMsg::Decode(bytes).ok() + RouteMsg::Decode(bytes).ok() +
               KvMsg::Decode(bytes).ok() + TokensMsg::Decode(bytes).ok() + FailedMsg::Decode(bytes).ok() +
               ShutdownMsg::Decode(bytes).ok() + ReadyMsg::Decode(bytes).ok() + KvOfferMsg::Decode(bytes).ok() +
               KvAcceptMsg::Decode(bytes).ok();
  }
  EXPECT_GT(decoded, 0);  // corrupted payload bytes (not counts or tags) still decode: the format has no checksum
}

TEST(Protocol, KvChecksumIsFnv1aOfTheBytes) {
  // FNV-1a 64 of no bytes is the offset basis.
  EXPECT_EQ(KvChecksum({}), 1469598103934665603ULL);
  EXPECT_NE(KvChecksum({1.f}), KvChecksum({2.f}));
}

}  // namespace
}  // namespace eldr
