// Hot arrays in 2 MiB pages (DESIGN.md §3 "Band routing", the router's working set).
//
// The router's per-decision arrays (the centroid rows, the signature cache's block rows, the predicted union's
// product rows) are read whole on every request and together fill most of a core's L2. With 4 KiB pages the L2
// sets an array maps to follow its physical pages, so one process reads a 480 KiB array from L2 in 3.5 µs and the
// next, with other pages, in 6.6 µs (measured on this project's VMs). A 2 MiB page is contiguous in physical
// memory: the array covers the sets evenly, in every process. Linux backs an aligned, MADV_HUGEPAGE region with
// transparent huge pages when THP is "always" or "madvise" (Debian's default); the advice is only a hint, so where
// none is granted the array simply stays in 4 KiB pages.
//
// HugePageAllocator<T> gives arrays of at least kHugePageMinBytes a region aligned to and rounded up to 2 MiB
// (at most 2 MiB − 1 byte more than asked, once per array), and smaller ones plain operator new. Stateless: any
// two allocators of a type are equal.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace eldr {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr size_t kHugePageMinBytes = size_t{64} << 10;

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT(runtime/explicit): the allocator rebind contract

  // No object may exceed PTRDIFF_MAX bytes, its rounding up to whole huge pages included (nor may the rounding wrap):
  // the vector grows no further (length_error) and allocate refuses more.
  size_t max_size() const noexcept { return (static_cast<size_t>(PTRDIFF_MAX) - kHugePageBytes) / sizeof(T); }
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (n > max_size()) throw std::bad_array_new_length();
    if (bytes < kHugePageMinBytes) return static_cast<T*>(::operator new (bytes, std::align_val_t{alignof(T)}));
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without it granted the region is ordinary memory
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePageMinBytes) {
      ::operator delete (p, std::align_val_t{alignof(T)});
    } else {
      std::free(p);
    }
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

// A std::vector whose storage, when large, lies in 2 MiB pages.
template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace eldr
