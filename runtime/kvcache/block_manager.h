// Paged KV-cache bookkeeping with prefix caching (DESIGN.md §3 "Signature cache", §4 kvcache/).
//
// The cache has `num_blocks` blocks of `block_size` tokens. Block ids are the indices shared by the
// executor's KV tensors and the signature cache. A *full* block of a prompt is identified by a chained
// hash: hash(parent block's hash, the block's token ids), so equal prefixes map to the same blocks.
// Cached blocks are reference counted; a block whose count drops to zero stays cached (reusable by a
// later prefix hit) on an LRU list until its slot is needed, then it is evicted. A sequence's last,
// partial block is never shared.
//
// Thread safety: not thread-safe; one owner (a prefill or decode worker) calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

using BlockId = int32_t;

struct PromptAllocation {
  std::vector<BlockId> blocks;        // ceil(prompt_len / block_size) blocks, in token order
  int num_cached_blocks = 0;          // leading blocks that were prefix-cache hits (already computed)
  int64_t num_cached_tokens() const;  // num_cached_blocks * block_size
  int block_size = 0;
  // Blocks [num_cached_blocks, blocks.size()) must be computed by prefill.
};

class BlockManager {
 public:
  // Called with the id of a block whose content is gone: a cached block evicted, or an uncached block (a
  // sequence's partial last block, a decode block) freed. Co-indexed data (the signature cache row) is
  // dropped with it.
  using EvictionCallback = std::function<void(BlockId)>;

  static constexpr int kDefaultBlockSize = 16;
  explicit BlockManager(int num_blocks, int block_size = kDefaultBlockSize);
  // Host bytes a manager of n blocks can hold: its per-block tables (reference count, hash, cached flag, free
  // list) and, with `prefix_cache` (a prefill rank's, whose every block may end up cached), a cache entry per block
  // (hash-map node, CachedBlock with its block_size token ids, LRU node: about 150 bytes plus the tokens).
  static double MemoryBytes(int64_t num_blocks, int block_size, bool prefix_cache) {
    const double tables = sizeof(int) + sizeof(uint64_t) + sizeof(uint8_t) + sizeof(BlockId);
    return static_cast<double>(num_blocks) * (tables + (prefix_cache ? 150.0 + sizeof(int32_t) * block_size : 0.0));
  }

  // Allocates the blocks of a prompt, reusing cached prefix blocks. The new full blocks are registered in
  // the prefix cache at once (the caller fills them before any other allocation sees them, as prefill
  // runs to completion). ResourceExhausted, with nothing allocated, when free + evictable blocks do not
  // suffice.
  Result<PromptAllocation> AllocatePrompt(const std::vector<int32_t>& tokens);

  // Allocates `n` private (uncached) blocks, all or nothing: a decoder receiving a prefilled sequence's KV
  // reserves its whole context this way. ResourceExhausted, nothing allocated, when they cannot be had.
  Result<std::vector<BlockId>> AllocateBlocks(int n);
  // Whether AllocateBlocks(n) would succeed now.
  bool CanAllocate(int n) const { return n <= static_cast<int>(free_.size() + lru_.size()); }

  // Makes room for one more token of a sequence holding `num_tokens` tokens in `blocks` (decode):
  // appends a fresh block when the last one is full. ResourceExhausted when no block can be had.
  Status AppendSlot(std::vector<BlockId>* blocks, int64_t num_tokens);

  // Releases a sequence's blocks (in any order). Cached blocks whose count reaches zero become evictable
  // (most recently used last); uncached ones return to the free list.
  void Free(const std::vector<BlockId>& blocks);

  void set_eviction_callback(EvictionCallback cb) { on_evict_ = std::move(cb); }

  int num_blocks() const { return static_cast<int>(ref_count_.size()); }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }
  int num_evictable_blocks() const { return static_cast<int>(lru_.size()); }
  int num_cached_blocks() const { return static_cast<int>(cache_.size()); }
  int ref_count(BlockId b) const { return ref_count_[b]; }
  int64_t num_evictions() const { return num_evictions_; }
  int64_t num_hits() const { return num_hit_blocks_; }

  // The chained hash of a full block (exposed for tests).
  static uint64_t BlockHash(uint64_t parent, const int32_t* tokens, int n);

 private:
  struct CachedBlock {
    BlockId id;
    uint64_t parent;
    std::vector<int32_t> tokens;       // the key, kept to rule out hash collisions
    std::list<BlockId>::iterator lru;  // valid while ref_count == 0
  };
  Result<BlockId> TakeBlock();  // a free block, else evict the least recently used cached one
  BlockId Lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const;

  int block_size_;
  std::vector<int> ref_count_;                       // [num_blocks]
  std::vector<uint64_t> block_hash_;                 // [num_blocks], valid when cached_[b]
  std::vector<uint8_t> cached_;                      // [num_blocks]
  std::vector<BlockId> free_;                        // uncached, unreferenced
  std::list<BlockId> lru_;                           // cached, unreferenced; front = least recently used
  std::unordered_map<uint64_t, CachedBlock> cache_;  // hash → block
  EvictionCallback on_evict_;
  int64_t num_evictions_ = 0;
  int64_t num_hit_blocks_ = 0;
};

}  // namespace eldr
