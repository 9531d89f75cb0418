#include "runtime/common/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

namespace eldr {
namespace {

TEST(HugePageVector, LargeArraysStartOnA2MiBBoundarySmallOnesAreOrdinary) {
  // 64 KiB and above: aligned to 2 MiB (the page a THP region needs); below: operator new's alignment only.
  HugePageVector<double> large(kHugePageMinBytes / sizeof(double));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u);
  HugePageVector<int16_t> odd(3 * kHugePageBytes / 2 + 7);  // rounded up to 4 MiB, still aligned
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd.data()) % kHugePageBytes, 0u);
  HugePageVector<float> small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % alignof(float), 0u);
}

TEST(HugePageVector, BehavesAsAVectorAcrossTheSizeThreshold) {
  // Growing from below the threshold to above it and back moves the elements between the two kinds of storage:
  // every value survives, and each block is freed by the path that allocated it (ASan / the heap would object).
  HugePageVector<int32_t> v;
  for (int32_t i = 0; i < 100000; ++i) v.push_back(i);  // 400 KB: crosses 64 KiB on the way
  HugePageVector<int32_t> want(v.size());
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(v, want);
  v.resize(10);
  v.shrink_to_fit();  // back below the threshold
  ASSERT_EQ(v.size(), 10u);
  EXPECT_EQ(v[9], 9);
  HugePageVector<int32_t> copy = want;
  EXPECT_EQ(copy, want);
  copy.assign(5, 7);
  EXPECT_EQ(copy, HugePageVector<int32_t>(5, 7));
}

}  // namespace
}  // namespace eldr
