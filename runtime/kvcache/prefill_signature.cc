#include "runtime/kvcache/prefill_signature.h"

#include <algorithm>

namespace eldr {

void AttachSignatureCache(BlockManager& blocks, SignatureCache& cache) {
  blocks.set_eviction_callback([&cache](BlockId b) { cache.DropBlock(b); });
}

Result<PrefillBlocks> PrefillPrompt(BlockManager& blocks, SignatureCache& cache, const std::vector<int32_t>& tokens,
                                    const uint16_t* topk_ids, int num_layers, int top_k,
                                    const std::vector<uint8_t>* layer_mask) {
  PrefillBlocks out;
  ELDR_ASSIGN_OR_RETURN(out.allocation, blocks.AllocatePrompt(tokens));
  const int bs = blocks.block_size();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const size_t token_stride = static_cast<size_t>(num_layers) * top_k;
  for (size_t i = out.allocation.num_cached_blocks; i < out.allocation.blocks.size(); ++i) {
    const int64_t first = static_cast<int64_t>(i) * bs;
    const int count = static_cast<int>(std::min<int64_t>(bs, n - first));
    cache.WriteBlock(out.allocation.blocks[i], topk_ids + first * token_stride, count, top_k);
  }
  out.counts.assign(cache.row_size(), 0.f);
  cache.SumCounts(out.allocation.blocks, layer_mask, out.counts.data());
  return out;
}

}  // namespace eldr
