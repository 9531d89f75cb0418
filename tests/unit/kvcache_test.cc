// The KV block manager (hand-computed cases) and the signature cache property: the counts assembled from
// block rows equal the from-scratch counts exactly, in every prefix-caching situation, over thousands of
// seeded scenarios.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/prefill_signature.h"
#include "runtime/kvcache/signature_cache.h"
#include "runtime/signature/signature.h"

namespace eldr {
namespace {

std::vector<int32_t> Tokens(int n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = start + i;
  return t;
}

TEST(BlockManager, PrefixHitsShareFullBlocksOnly) {
  BlockManager bm(10, 16);
  auto a = bm.AllocatePrompt(Tokens(40));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->blocks.size(), 3u);
  EXPECT_EQ(a->num_cached_blocks, 0);
  auto b = bm.AllocatePrompt(Tokens(40));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->num_cached_blocks, 2);  // the two full blocks; the partial third is private
  EXPECT_EQ(b->num_cached_tokens(), 32);
  EXPECT_EQ(b->blocks[0], a->blocks[0]);
  EXPECT_EQ(b->blocks[1], a->blocks[1]);
  EXPECT_NE(b->blocks[2], a->blocks[2]);
  EXPECT_EQ(bm.ref_count(a->blocks[0]), 2);
  // A different first block breaks the chain even if later tokens match.
  auto t = Tokens(40);
  t[0] = 999;
  auto c = bm.AllocatePrompt(t);
  EXPECT_EQ(c->num_cached_blocks, 0);
  EXPECT_EQ(bm.num_free_blocks(), 10 - 3 - 1 - 3);
}

TEST(BlockManager, FreedCachedBlocksAreReusedThenEvictedLru) {
  BlockManager bm(4, 2);
  std::vector<BlockId> evicted;
  bm.set_eviction_callback([&](BlockId b) { evicted.push_back(b); });
  auto a = bm.AllocatePrompt(Tokens(4, 0));    // 2 full blocks, cached
  auto b = bm.AllocatePrompt(Tokens(4, 100));  // 2 more
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(bm.num_free_blocks(), 0);
  bm.Free(a->blocks);
  bm.Free(b->blocks);
  EXPECT_EQ(bm.num_evictable_blocks(), 4);
  // A hit on a's prefix reuses its blocks without eviction.
  auto a2 = bm.AllocatePrompt(Tokens(4, 0));
  EXPECT_EQ(a2->num_cached_blocks, 2);
  EXPECT_TRUE(evicted.empty());
  // A new prompt of 2 blocks must evict b's blocks (the only unreferenced ones), oldest first.
  auto c = bm.AllocatePrompt(Tokens(4, 200));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(evicted, b->blocks);
  EXPECT_EQ(bm.num_evictions(), 2);
  // b is no longer cached.
  bm.Free(c->blocks);
  auto b2 = bm.AllocatePrompt(Tokens(4, 100));
  EXPECT_EQ(b2->num_cached_blocks, 0);
}

TEST(BlockManager, ExhaustionIsAValueAndAllocatesNothing) {
  BlockManager bm(3, 4);
  auto a = bm.AllocatePrompt(Tokens(8));
  ASSERT_TRUE(a.ok());
  auto b = bm.AllocatePrompt(Tokens(9, 50));  // needs 3 blocks, only 1 free
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  // A hit on a's blocks needs only the partial block.
  auto c = bm.AllocatePrompt(Tokens(9));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_cached_blocks, 2);
  EXPECT_EQ(bm.num_free_blocks(), 0);
}

TEST(BlockManager, AppendSlotGrowsAtBlockBoundaries) {
  BlockManager bm(3, 4);
  auto a = bm.AllocatePrompt(Tokens(3));
  std::vector<BlockId> blocks = a->blocks;
  ASSERT_TRUE(bm.AppendSlot(&blocks, 3).ok());  // 4th token fits in block 0
  EXPECT_EQ(blocks.size(), 1u);
  ASSERT_TRUE(bm.AppendSlot(&blocks, 4).ok());  // 5th token needs a new block
  EXPECT_EQ(blocks.size(), 2u);
  ASSERT_TRUE(bm.AppendSlot(&blocks, 8).ok());
  EXPECT_EQ(blocks.size(), 3u);
  EXPECT_EQ(bm.AppendSlot(&blocks, 12).code(), StatusCode::kResourceExhausted);
}

TEST(SignatureCache, FootprintOfQwen3_30B_A3B) {
  // 48 MoE layers × 128 experts at 4 bits = 3072 B per block; KV: 2 × 48 × 4 × 128 × 2 B × 16 = 1.5 MiB.
  auto f = ComputeSignatureCacheFootprint(48, 128, 48, 4, 128, 2, 16);
  EXPECT_EQ(f.signature_bytes_per_block, 3072);
  EXPECT_EQ(f.kv_bytes_per_block, 1572864);
  EXPECT_NEAR(f.ratio(), 3072.0 / 1572864.0, 1e-12);
  // A row is padded to whole 128-entry spans: 26 × 64 = 1664 entries → 13 spans → 832 B.
  EXPECT_EQ(ComputeSignatureCacheFootprint(26, 64, 27, 16, 128, 2, 16).signature_bytes_per_block, 832);
  EXPECT_LE(f.ratio(), 0.01);
}

TEST(SignatureCache, SumsBeyondTheInt16RangeStayExact) {
  // 600 blocks of 127 tokens, every token routed to experts {0, 1} at both layers: the sum, 76200 per
  // entry, overflows int16 unless the partial sums are flushed in time.
  const int bs = 127, n = 600;
  SignatureCache sc(n, 2, 4, bs);
  std::vector<uint16_t> ids;
  for (int t = 0; t < bs; ++t) ids.insert(ids.end(), {0, 1, 0, 1});
  std::vector<BlockId> blocks;
  for (int b = 0; b < n; ++b) {
    sc.WriteBlock(b, ids.data(), bs, 2);
    blocks.push_back(b);
  }
  std::vector<float> counts(8);
  sc.SumCounts(blocks, nullptr, counts.data());
  EXPECT_EQ(counts, (std::vector<float>{76200, 76200, 0, 0, 76200, 76200, 0, 0}));
  std::vector<uint8_t> mask = {0, 1};
  sc.SumCounts(blocks, &mask, counts.data());
  EXPECT_EQ(counts, (std::vector<float>{0, 0, 0, 0, 76200, 76200, 0, 0}));
}

TEST(SignatureCache, SumCountsEqualsANaiveSumForAnyMaskBlockSizeAndLength) {
  // The packed rows (nibbles + escape lists for counts >= 16) and the uint8 / uint16 / uint32 staging against
  // counts taken straight from the ids and a plain int64 sum: block sizes around 16 (counts of 15, 16, 17 in the
  // skewed blocks) and up to 127 (escapes of up to 7 · 16), layers narrower than, equal to and wider than the
  // 128-entry spans, prompts long enough to flush uint16 more than once, repeated blocks, any mask.
  std::mt19937_64 rng(7);
  for (int scenario = 0; scenario < 80; ++scenario) {
    const int bs = std::vector<int>{1, 15, 16, 17, 64, 127}[rng() % 6];
    const int L = 1 + static_cast<int>(rng() % 5);
    const int E = std::vector<int>{1 + static_cast<int>(rng() % 70), 64, 128, 200}[rng() % 4];
    const int k = 1 + static_cast<int>(rng() % std::min(E, 4));
    const int num_blocks = 1 + static_cast<int>(rng() % 40);
    SignatureCache sc(num_blocks, L, E, bs);
    std::vector<uint16_t> ids(static_cast<size_t>(bs) * L * k);
    std::vector<std::vector<int64_t>> row(num_blocks, std::vector<int64_t>(static_cast<size_t>(L) * E, 0));
    for (int b = 0; b < num_blocks; ++b) {
      const int n = 1 + static_cast<int>(rng() % bs);
      // The most skewed rows (every token to experts 0..k-1) in some blocks, random distinct top-k otherwise.
      const bool skewed = rng() % 3 == 0;
      for (int t = 0; t < n * L; ++t) {
        const int first = skewed ? 0 : static_cast<int>(rng() % (E - k + 1));
        for (int j = 0; j < k; ++j) ids[t * k + j] = static_cast<uint16_t>(first + j);
      }
      sc.WriteBlock(b, ids.data(), n, k);
      for (int t = 0; t < n; ++t) {  // the block's counts straight from its ids
        for (int l = 0; l < L; ++l) {
          for (int j = 0; j < k; ++j) ++row[b][l * E + ids[(t * L + l) * k + j]];
        }
      }
      for (size_t x = 0; x < row[b].size(); ++x) ASSERT_EQ(sc.Count(b, x), row[b][x]) << "block " << b << " " << x;
    }
    std::vector<BlockId> seq(rng() % 3 == 0 ? 1000 + rng() % 1000 : rng() % 300);
    for (auto& b : seq) b = static_cast<BlockId>(rng() % num_blocks);
    std::vector<uint8_t> mask(L);
    for (auto& m : mask) m = rng() % 2;
    const bool use_mask = rng() % 2;
    std::vector<int64_t> want(static_cast<size_t>(L) * E, 0);
    for (BlockId b : seq) {
      for (int l = 0; l < L; ++l) {
        if (use_mask && !mask[l]) continue;
        for (int e = 0; e < E; ++e) want[l * E + e] += row[b][l * E + e];
      }
    }
    std::vector<float> got(want.size(), -1.f);
    sc.SumCounts(seq, use_mask ? &mask : nullptr, got.data());
    for (size_t x = 0; x < want.size(); ++x) {
      ASSERT_EQ(got[x], static_cast<float>(want[x])) << "scenario " << scenario << " entry " << x;
    }
  }
}

TEST(SignatureCache, SumCountsIsExactWhenEveryNibbleIsFifteen) {
  // The largest nibble in every entry of every row: a full group of 16 rows sums to 240 in each byte, the edge of
  // the averaging tree for the high nibbles and of the mod-256 difference for the low ones (AddSpanGroup). Rows
  // of 15 tokens that each route to all 128 experts (low and high nibbles of every span) count 15 everywhere;
  // prompts of 16 · m rows (full groups only) and of 16 · m + 5 (a short last group), with a mask too.
  constexpr int L = 3, E = 128, kTokens = 15;
  for (int blocks : {16, 32, 37, 4112}) {
    SignatureCache sc(blocks, L, E, kTokens);
    std::vector<uint16_t> ids(static_cast<size_t>(kTokens) * L * E);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % E);
    std::vector<BlockId> seq;
    for (int b = 0; b < blocks; ++b) {
      sc.WriteBlock(b, ids.data(), kTokens, E);
      seq.push_back(b);
    }
    for (const bool masked : {false, true}) {
      const std::vector<uint8_t> mask = {1, 0, 1};
      std::vector<float> got(static_cast<size_t>(L) * E, -1.f);
      sc.SumCounts(seq, masked ? &mask : nullptr, got.data());
      for (int l = 0; l < L; ++l) {
        const float want = masked && !mask[l] ? 0.f : static_cast<float>(kTokens) * blocks;
        for (int e = 0; e < E; ++e)
          ASSERT_EQ(got[l * E + e], want) << blocks << " blocks, layer " << l << " expert " << e;
      }
    }
  }
}

// ---- the exactness property ----

constexpr int kL = 3, kE = 8, kTopK = 2;

// Routing of the token at position t depends on the whole prefix (a causal model): derive it from a
// running hash of the prefix. Returns topk_ids [n, L, k].
std::vector<uint16_t> CausalRouting(const std::vector<int32_t>& tokens) {
  std::vector<uint16_t> ids;
  uint64_t h = 1469598103934665603ULL;
  for (int32_t tok : tokens) {
    h = (h ^ static_cast<uint64_t>(tok)) * 1099511628211ULL;
    for (int l = 0; l < kL; ++l) {
      uint64_t x = h + 0x9e3779b97f4a7c15ULL * (l + 1);
      x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ULL;
      const uint16_t a = static_cast<uint16_t>(x % kE);
      const uint16_t b = static_cast<uint16_t>((a + 1 + (x >> 20) % (kE - 1)) % kE);  // distinct from a
      ids.push_back(a);
      ids.push_back(b);
    }
  }
  return ids;
}

// From scratch: c(ℓ,e) = number of prompt tokens whose top-k at ℓ contains e.
std::vector<float> ScratchCounts(const std::vector<uint16_t>& ids, size_t n) {
  std::vector<float> c(kL * kE, 0.f);
  for (size_t t = 0; t < n; ++t) {
    for (int l = 0; l < kL; ++l) {
      for (int j = 0; j < kTopK; ++j) c[l * kE + ids[(t * kL + l) * kTopK + j]] += 1.f;
    }
  }
  return c;
}

TEST(SignatureCache, BlockRowsGiveExactlyTheFromScratchSignature) {
  std::mt19937_64 rng(2024);
  int cold = 0, partial_hit = 0, full_hit = 0, recomputed = 0, partial_last = 0, shared_many = 0;
  for (int scenario = 0; scenario < 3000; ++scenario) {
    const int block_size = std::vector<int>{1, 2, 3, 4, 16}[rng() % 5];
    const int num_blocks = 4 + static_cast<int>(rng() % 40);
    BlockManager bm(num_blocks, block_size);
    SignatureCache sc(num_blocks, kL, kE, block_size);
    AttachSignatureCache(bm, sc);
    // Signature parameters: random IDF and a random non-empty mask.
    SignatureParams params;
    params.variant = SignatureVariant::kCountIdf;
    params.num_layers = kL;
    params.num_experts = kE;
    for (int x = 0; x < kL * kE; ++x) params.idf.push_back(static_cast<float>(rng() % 100) / 25.f);
    params.layer_mask.assign(kL, 0);
    params.layer_mask[rng() % kL] = 1;
    for (int l = 0; l < kL; ++l) params.layer_mask[l] |= (rng() % 2);
    const bool use_mask = rng() % 2;
    // A few shared prefixes; prompts are a prefix plus a random tail.
    std::vector<std::vector<int32_t>> prefixes(1 + rng() % 3);
    for (auto& p : prefixes) {
      p.resize(rng() % (3 * block_size + 2));
      for (auto& t : p) t = static_cast<int32_t>(rng() % 5);
    }
    std::vector<std::vector<BlockId>> held;
    std::set<uint64_t> seen_first_blocks;
    std::map<BlockId, int> hold_count;
    const int64_t evictions_before = 0;
    (void)evictions_before;
    for (int op = 0; op < 12; ++op) {
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const int tail = static_cast<int>(rng() % (2 * block_size + 1));
      for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<int32_t>(rng() % 5));
      if (prompt.empty()) prompt.push_back(1);
      const auto routing = CausalRouting(prompt);
      const int64_t ev0 = bm.num_evictions();
      auto r = PrefillPrompt(bm, sc, prompt, routing.data(), kL, kTopK, use_mask ? &params.layer_mask : nullptr);
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
        for (auto& h : held) bm.Free(h);
        held.clear();
        continue;
      }
      // Exactness of counts (masked layers when a mask was used) and of the signature.
      std::vector<float> scratch = ScratchCounts(routing, prompt.size());
      for (int l = 0; l < kL; ++l) {
        for (int e = 0; e < kE; ++e) {
          const float want = (!use_mask || params.layer_mask[l]) ? scratch[l * kE + e] : 0.f;
          ASSERT_EQ(r->counts[l * kE + e], want) << "scenario " << scenario << " op " << op;
        }
      }
      std::vector<float> s1(params.dim()), s2(params.dim());
      ComputeSignature(params, r->counts.data(), nullptr, s1.data());
      ComputeSignature(params, scratch.data(), nullptr, s2.data());
      ASSERT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float))) << "scenario " << scenario;
      // Classify what happened, to prove every case was exercised.
      const int64_t full = static_cast<int64_t>(prompt.size()) / block_size;
      const int hit = r->allocation.num_cached_blocks;
      if (hit == 0) ++cold;
      if (hit > 0 && hit < full) ++partial_hit;
      if (hit > 0 && hit == full && prompt.size() % block_size == 0) ++full_hit;
      if (prompt.size() % block_size != 0) ++partial_last;
      // A prefix block computed before, evicted since, and computed again now.
      if (full > 0) {
        const uint64_t first = BlockManager::BlockHash(0, prompt.data(), block_size);
        if (hit == 0 && seen_first_blocks.count(first)) ++recomputed;
        seen_first_blocks.insert(first);
      }
      (void)ev0;
      for (int i = 0; i < hit; ++i) {
        if (bm.ref_count(r->allocation.blocks[i]) >= 3) {
          ++shared_many;
          break;
        }
      }
      // Keep or release the sequence.
      if (rng() % 3 == 0) {
        bm.Free(r->allocation.blocks);
      } else {
        held.push_back(r->allocation.blocks);
      }
      if (rng() % 4 == 0 && !held.empty()) {
        const size_t i = rng() % held.size();
        bm.Free(held[i]);
        held.erase(held.begin() + static_cast<long>(i));
      }
    }
    for (auto& h : held) bm.Free(h);
  }
  EXPECT_GT(cold, 100);
  EXPECT_GT(partial_hit, 100);
  EXPECT_GT(full_hit, 100);
  EXPECT_GT(recomputed, 100);
  EXPECT_GT(partial_last, 100);
  EXPECT_GT(shared_many, 100);
}

}  // namespace
}  // namespace eldr
