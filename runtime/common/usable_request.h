// The "usable request" test: which requests of a routing trace the offline tools learn from and replay.
// A request is usable when it has prompt tokens (its signature, DESIGN.md §3, is built from them) and decode
// tokens (its decode profile, or the decode steps a replay forms). `eldr calibrate` clusters the usable
// requests only and `eldr place evaluate` replays only them; both count the others as skipped.
#pragma once

#include <cstdint>

namespace eldr {

// prompt_len: prefill tokens; decode_len: tokens after the prompt (a trace row's num_tokens − prompt_len).
inline bool IsUsableRequest(int64_t prompt_len, int64_t decode_len) { return prompt_len > 0 && decode_len > 0; }

}  // namespace eldr
