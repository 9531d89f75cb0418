// The prefill side of the signature cache: allocate a prompt's KV blocks (prefix hits reused), write the
// signature rows of the blocks prefill computes, and assemble the request's counts from the block rows.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/signature_cache.h"

namespace eldr {

struct PrefillBlocks {
  PromptAllocation allocation;
  std::vector<float> counts;  // [L, E] c_r(ℓ,e) assembled from block rows (masked layers only if a mask is given)
};

// tokens: the prompt's token ids [P]; topk_ids: the prompt's routing [P, L, top_k] (what prefill's gates
// produce). Blocks that were prefix hits keep their rows; the others get rows written from topk_ids.
// ResourceExhausted (nothing allocated) when the KV cache is full.
// REQUIRES: `cache` was built for the same number of blocks and block size as `blocks`, and its rows are
// dropped on eviction (AttachSignatureCache).
Result<PrefillBlocks> PrefillPrompt(BlockManager& blocks, SignatureCache& cache, const std::vector<int32_t>& tokens,
                                    const uint16_t* topk_ids, int num_layers, int top_k,
                                    const std::vector<uint8_t>* layer_mask);

// Wires eviction in `blocks` to DropBlock in `cache`, so a row never outlives its block.
void AttachSignatureCache(BlockManager& blocks, SignatureCache& cache);

}  // namespace eldr
