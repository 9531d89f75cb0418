// The messages of an `eldr serve` job (DESIGN.md §2): one struct per MPI tag, each with Encode() → bytes and
// Decode(bytes) → Result<T> (leveldb's VersionEdit::EncodeTo/DecodeFrom shape). Every rank writes and reads its
// messages through these structs only; nothing is written field by field elsewhere.
//
// Wire format: byte 0 is the message's tag (the same number as the MPI tag, so a payload handed to the wrong
// decoder is recognised), then the fields in declaration order, fixed-width in host byte order (every rank of
// a job runs the same binary on the same architecture); a vector or string is a uint64 element count followed
// by its elements. A message ends exactly where its last field ends.
//
// Decode never reads past the buffer and never throws: a truncated message, a count larger than the bytes that
// follow, trailing bytes, a bool that is not 0/1 or a wrong tag give Status::Corrupt naming the message and
// what is wrong. Request ids are workload request indices (job/workload.h), integers end to end.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// The MPI tags of a serve job. Rank 0 is the router; "prefill" and "decode" are the other roles.
enum MessageTag : int {
  kTagPrefill = 1,    // 0 → prefill: PrefillRequestMsg
  kTagCounts = 2,     // prefill → 0: CountsMsg
  kTagRoute = 3,      // 0 → prefill: RouteMsg
  kTagKvOffer = 4,    // prefill → decode leader: KvOfferMsg (a routed request, its KV still on the prefill rank)
  kTagTokens = 5,     // decode leader → 0: TokensMsg
  kTagFailed = 6,     // prefill/decode → 0: FailedMsg
  kTagShutdown = 7,   // 0 → every other rank: ShutdownMsg
  kTagReady = 8,      // every other rank → 0, once its weights are loaded: ReadyMsg
  kTagHeartbeat = 9,  // 0 → every worker (ping) and back (pong): HeartbeatMsg
  kTagBye = 10,       // prefill/decode leader → 0, the last message after a ShutdownMsg: ByeMsg
  kTagKvAccept = 11,  // decode leader → prefill: KvAcceptMsg (blocks allocated: send the KV; or refused)
  kTagKv = 12,        // prefill → decode leader: KvMsg (the KV, inline or announcing the KV transport's transfer)
};

// The name of a tag ("counts", "tokens", ...), or "unknown".
const char* MessageTagName(int tag);

// 0 → prefill: prefill workload request `request`.
struct PrefillRequestMsg {
  static constexpr int kTag = kTagPrefill;
  int64_t request = 0;

  std::vector<uint8_t> Encode() const;
  static Result<PrefillRequestMsg> Decode(std::span<const uint8_t> bytes);
};

// prefill → 0: the prefill of `request` is done.
struct CountsMsg {
  static constexpr int kTag = kTagCounts;
  int64_t request = 0;
  int32_t first_token = 0;      // sampled from the prefill's logits
  std::vector<float> counts;    // [L_moe, E] the prompt's expert counts, summed from its blocks' signature rows
  double seconds = 0;           // the prefill call's wall time
  double cpu_seconds = 0;       // the prefill rank's CPU time over the same span
  int64_t computed_tokens = 0;  // prompt tokens computed (not served from the prefix cache)

  std::vector<uint8_t> Encode() const;
  static Result<CountsMsg> Decode(std::span<const uint8_t> bytes);
};

// 0 → prefill: ship `request`'s KV to the decoder whose leader is `decoder_rank`.
struct RouteMsg {
  static constexpr int kTag = kTagRoute;
  int64_t request = 0;
  int32_t decoder_rank = 0;

  std::vector<uint8_t> Encode() const;
  static Result<RouteMsg> Decode(std::span<const uint8_t> bytes);
};

// The KV handoff of a routed request (DESIGN.md §2 "KV handoff"), three messages:
//   prefill → decoder  KvOfferMsg   the request and the size of its KV; the KV stays in the prefill rank's blocks
//   decoder → prefill  KvAcceptMsg  sent once the decoder has allocated the request's blocks and batch slot
//                                   (at once, or when a finished request frees them: FIFO); refused when the
//                                   request can never fit, and the decoder reports the failure to rank 0
//   prefill → decoder  KvMsg        the KV (inline, or over the KV transport right after it); the prefill rank
//                                   frees its blocks only when this send has completed
// So a decoder holds no KV of a request it has not allocated blocks for (its queue is metadata only), and a
// decoder that is full when a request is routed to it leaves the KV where it is until it has room.

// prefill → decode leader: a prefilled request, offered.
struct KvOfferMsg {
  static constexpr int kTag = kTagKvOffer;
  int64_t request = 0;
  int64_t prompt_len = 0;
  int64_t output_len = 0;  // output tokens, prefill's included
  int32_t first_token = 0;
  uint64_t kv_floats = 0;            // floats of its KV: [layers, 2, prompt_len, kv_heads, head_dim]
  std::vector<uint16_t> replay_ids;  // [output_len - 1, L_moe, top_k] replayed decode routing, or empty

  std::vector<uint8_t> Encode() const;
  static Result<KvOfferMsg> Decode(std::span<const uint8_t> bytes);
};

// decode leader → prefill: the offer of `request` is taken (its blocks are allocated: send the KV) or refused
// (never fits; the decoder has told rank 0; the prefill rank frees its blocks).
struct KvAcceptMsg {
  static constexpr int kTag = kTagKvAccept;
  int64_t request = 0;
  bool accepted = true;

  std::vector<uint8_t> Encode() const;
  static Result<KvAcceptMsg> Decode(std::span<const uint8_t> bytes);
};

// prefill → decode leader: the KV of an accepted request. With the KV inline (kv_inline) `kv` holds the floats;
// otherwise `kv` is empty, `kv_floats` floats follow over the KV transport (comm/kv_transport.h) and the decoder
// posts that receive when it handles this message.
struct KvMsg {
  static constexpr int kTag = kTagKv;
  int64_t request = 0;
  bool kv_inline = true;
  std::vector<float> kv;     // [layers, 2, prompt_len, kv_heads, head_dim] when kv_inline, else empty
  uint64_t kv_floats = 0;    // floats of the KV, inline or not
  uint64_t kv_checksum = 0;  // KvChecksum of the floats

  std::vector<uint8_t> Encode() const;
  static Result<KvMsg> Decode(std::span<const uint8_t> bytes);
};

// FNV-1a over the floats' bytes: the decoder checks that the KV arrived intact.
uint64_t KvChecksum(const std::vector<float>& kv);

// One output token as the decoder reports it.
struct TokenRecord {
  int64_t request = 0;
  int64_t index = 0;  // output token index (1 .. output_len - 1; 0 is prefill's)
  int32_t token = 0;
  bool finished = false;  // the request's last token
  bool operator==(const TokenRecord&) const = default;
};

// decode leader → 0: one iteration of the decoder's loop (batch 0: nothing ran, e.g. only admissions).
struct TokensMsg {
  static constexpr int kTag = kTagTokens;
  int32_t batch = 0;                // sequences in the step
  int64_t distinct_experts = 0;     // Σ over MoE layers of |∪ top-k| of the step
  int64_t context_tokens = 0;       // Σ over the batch of the tokens attended
  double seconds = 0;               // the iteration's busy wall time
  double cpu_seconds = 0;           // the decoder process's CPU time over the same span
  std::vector<TokenRecord> tokens;  // in the order the decoder produced them
  std::vector<int64_t> rank_load;   // [ep_size] EP ranks' token·expert activations, empty unless ep_size > 1
  double balancedness = 0;          // the step's balancedness (ep_size > 1)

  std::vector<uint8_t> Encode() const;
  static Result<TokensMsg> Decode(std::span<const uint8_t> bytes);
};

// prefill/decode → 0: `request` failed on the sender.
struct FailedMsg {
  static constexpr int kTag = kTagFailed;
  int64_t request = 0;
  std::string reason;

  std::vector<uint8_t> Encode() const;
  static Result<FailedMsg> Decode(std::span<const uint8_t> bytes);
};

// 0 → every other rank: stop (a decoder leader stops its EP members) and answer with ByeMsg. job_failed: rank 0
// has reported the job's failure and exits without MPI_Finalize, so the receiver must not call it either (it
// would wait forever on a stopped or dead peer): it exits non-zero, silently.
struct ShutdownMsg {
  static constexpr int kTag = kTagShutdown;
  bool job_failed = false;
  std::vector<uint8_t> Encode() const;
  static Result<ShutdownMsg> Decode(std::span<const uint8_t> bytes);
};

// every other rank → 0: weights loaded, ready to serve.
struct ReadyMsg {
  static constexpr int kTag = kTagReady;
  std::vector<uint8_t> Encode() const;
  static Result<ReadyMsg> Decode(std::span<const uint8_t> bytes);
};

// 0 → every worker every JobConfig::HeartbeatInterval(), answered by the same message back: each side learns that
// the other is alive (serve.cc, "Liveness"). A worker's answer carries the signal it has received (SIGTERM, SIGINT,
// SIGHUP; 0 for none): rank 0 then ends the job and writes the metrics before that worker's exit can have the
// launcher kill every rank.
struct HeartbeatMsg {
  static constexpr int kTag = kTagHeartbeat;
  int32_t signal = 0;  // rank 0's ping: always 0
  std::vector<uint8_t> Encode() const;
  static Result<HeartbeatMsg> Decode(std::span<const uint8_t> bytes);
};

// prefill/decode leader → 0: the answer to ShutdownMsg; the sender sends nothing after it.
struct ByeMsg {
  static constexpr int kTag = kTagBye;
  std::vector<uint8_t> Encode() const;
  static Result<ByeMsg> Decode(std::span<const uint8_t> bytes);
};

}  // namespace eldr
