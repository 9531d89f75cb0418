#include "runtime/kvcache/block_manager.h"

#include <algorithm>

#include "runtime/common/check.h"

namespace eldr {

int64_t PromptAllocation::num_cached_tokens() const { return static_cast<int64_t>(num_cached_blocks) * block_size; }

BlockManager::BlockManager(int num_blocks, int block_size)
    : block_size_(block_size), ref_count_(num_blocks, 0), block_hash_(num_blocks, 0), cached_(num_blocks, 0) {
  ELDR_CHECK(num_blocks > 0 && block_size > 0, "a KV cache needs blocks and a block size");
  free_.reserve(num_blocks);
  // Hand out low ids first (pop from the back).
  for (BlockId b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

uint64_t BlockManager::BlockHash(uint64_t parent, const int32_t* tokens, int n) {
  // FNV-1a over the parent hash and the token ids, finished with a splitmix64 mix.
  uint64_t h = 1469598103934665603ULL ^ parent;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  };
  mix(parent);
  for (int i = 0; i < n; ++i) mix(static_cast<uint32_t>(tokens[i]));
  h += 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

BlockId BlockManager::Lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const CachedBlock& c = it->second;
  if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens)) return -1;  // collision
  return c.id;
}

Result<BlockId> BlockManager::TakeBlock() {
  if (!free_.empty()) {
    BlockId b = free_.back();
    free_.pop_back();
    return b;
  }
  if (lru_.empty()) return Status::ResourceExhausted("KV cache full: no free or evictable block");
  BlockId b = lru_.front();
  lru_.pop_front();
  cache_.erase(block_hash_[b]);
  cached_[b] = 0;
  ++num_evictions_;
  if (on_evict_) on_evict_(b);
  return b;
}

Result<PromptAllocation> BlockManager::AllocatePrompt(const std::vector<int32_t>& tokens) {
  PromptAllocation out;
  out.block_size = block_size_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t num_blocks = (n + block_size_ - 1) / block_size_;
  const int64_t num_full = n / block_size_;
  // Pass 1: the longest cached prefix of full blocks.
  uint64_t parent = 0;
  std::vector<uint64_t> hashes(num_full);
  std::vector<uint64_t> parents(num_full);
  int64_t hit = 0;
  for (int64_t i = 0; i < num_full; ++i) {
    parents[i] = parent;
    hashes[i] = BlockHash(parent, tokens.data() + i * block_size_, block_size_);
    parent = hashes[i];
  }
  while (hit < num_full && Lookup(hashes[hit], parents[hit], tokens.data() + hit * block_size_) >= 0) ++hit;
  // Feasibility before touching anything: hit blocks that sit on the LRU list stop being evictable.
  int64_t hit_on_lru = 0;
  for (int64_t i = 0; i < hit; ++i) {
    if (ref_count_[cache_.at(hashes[i]).id] == 0) ++hit_on_lru;
  }
  const int64_t need = num_blocks - hit;
  const int64_t available = static_cast<int64_t>(free_.size()) + static_cast<int64_t>(lru_.size()) - hit_on_lru;
  if (need > available) {
    return Status::ResourceExhausted("KV cache full: a " + std::to_string(n) + "-token prompt needs " +
                                     std::to_string(need) + " new blocks, " + std::to_string(available) +
                                     " can be had");
  }
  // Pass 2: take references on the hits (off the LRU list), then allocate the rest.
  for (int64_t i = 0; i < hit; ++i) {
    CachedBlock& c = cache_.at(hashes[i]);
    if (ref_count_[c.id]++ == 0) lru_.erase(c.lru);
    out.blocks.push_back(c.id);
  }
  num_hit_blocks_ += hit;
  out.num_cached_blocks = static_cast<int>(hit);
  for (int64_t i = hit; i < num_blocks; ++i) {
    auto b = TakeBlock();
    ELDR_CHECK(b.ok(), "block accounting: feasibility check passed but no block could be taken");
    const BlockId id = b.value();
    ref_count_[id] = 1;
    out.blocks.push_back(id);
    if (i < num_full) {
      // An entry under this hash can exist here only as an orphan (its parent block was evicted first,
      // so the prefix walk stopped earlier) or a collision. Drop it when unreferenced; if another
      // sequence holds it, leave the new block uncached.
      auto old = cache_.find(hashes[i]);
      if (old != cache_.end()) {
        const BlockId o = old->second.id;
        if (ref_count_[o] > 0) continue;
        lru_.erase(old->second.lru);
        cache_.erase(old);
        cached_[o] = 0;
        free_.push_back(o);
        ++num_evictions_;
        if (on_evict_) on_evict_(o);
      }
      CachedBlock c;
      c.id = id;
      c.parent = parents[i];
      c.tokens.assign(tokens.begin() + i * block_size_, tokens.begin() + (i + 1) * block_size_);
      cache_[hashes[i]] = std::move(c);
      block_hash_[id] = hashes[i];
      cached_[id] = 1;
    }
  }
  return out;
}

Result<std::vector<BlockId>> BlockManager::AllocateBlocks(int n) {
  if (n < 0) return Status::InvalidArgument("cannot allocate a negative number of blocks");
  if (!CanAllocate(n)) {
    return Status::ResourceExhausted("KV cache full: " + std::to_string(n) + " blocks needed, " +
                                     std::to_string(free_.size() + lru_.size()) + " can be had");
  }
  std::vector<BlockId> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto b = TakeBlock();
    ELDR_CHECK(b.ok(), "block accounting: CanAllocate passed but no block could be taken");
    ref_count_[b.value()] = 1;
    out.push_back(b.value());
  }
  return out;
}

Status BlockManager::AppendSlot(std::vector<BlockId>* blocks, int64_t num_tokens) {
  if (num_tokens < static_cast<int64_t>(blocks->size()) * block_size_) return Status::Ok();
  ELDR_ASSIGN_OR_RETURN(BlockId b, TakeBlock());
  ref_count_[b] = 1;
  blocks->push_back(b);
  return Status::Ok();
}

void BlockManager::Free(const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) {
    ELDR_CHECK(b >= 0 && b < num_blocks() && ref_count_[b] > 0, "freeing block " << b << " that is not held");
    if (--ref_count_[b] > 0) continue;
    if (cached_[b]) {
      lru_.push_back(b);
      cache_.at(block_hash_[b]).lru = std::prev(lru_.end());
    } else {
      free_.push_back(b);
      if (on_evict_) on_evict_(b);  // its content dies with it
    }
  }
}

}  // namespace eldr
