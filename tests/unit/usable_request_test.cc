// The usable-request test: prompt tokens (a signature) and decode tokens (a profile, decode steps).
#include "runtime/common/usable_request.h"

#include <gtest/gtest.h>

namespace eldr {
namespace {

TEST(IsUsableRequest, NeedsPromptAndDecodeTokens) {
  EXPECT_TRUE(IsUsableRequest(1, 1));
  EXPECT_TRUE(IsUsableRequest(512, 30));
  EXPECT_FALSE(IsUsableRequest(0, 5));  // no prompt: no signature
  EXPECT_FALSE(IsUsableRequest(7, 0));  // prefill only: no decode profile
  EXPECT_FALSE(IsUsableRequest(0, 0));
  EXPECT_FALSE(IsUsableRequest(4, -1));  // a malformed row (num_tokens < prompt_len)
}

}  // namespace
}  // namespace eldr
