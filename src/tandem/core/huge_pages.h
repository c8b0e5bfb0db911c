// Large host arrays on transparent huge pages: a 100 MB array first touched through 4 KiB
// pages takes about 25,000 page faults, which cost more than the bytes it is then filled
// with (a resume's reads measured half their time in faults); on 2 MiB pages it takes 50.
//
// For arrays made once (a resume's state, the cpu device's allocations at start), not for
// ones made again at every step or save: under THP's usual defrag setting ("madvise"), a
// fault in an advised range on a fragmented host waits for the kernel to compact memory
// (a save's staging copy measured 35-272 ms on huge pages against a steady 75-85 without).
#pragma once

#include <cstddef>
#include <vector>

namespace tandem {

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes) with huge pages
// when they are first touched (madvise MADV_HUGEPAGE). A hint: where transparent huge pages
// are off, or the range holds no whole huge page, nothing changes.
void advise_huge_pages(void* data, size_t bytes);

// Faults the pages of [data, data + bytes) in now (madvise MADV_POPULATE_WRITE, or a write
// to each page), on huge pages where advised: for memory that stands for a GPU's, which is
// committed when it is allocated, so that its first use pays no faults (a page first
// touched by another thread measured up to 10 times slower, and that thread is the one a
// copy runs on) and a host short of memory fails here, not mid-step.
void populate_pages(void* data, size_t bytes);

// v resized to n elements (value-initialised, as resize does), its new storage advised
// before anything touches it: for large arrays about to be filled.
template <typename T>
void resize_on_huge_pages(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) {
    v.reserve(n);
    advise_huge_pages(v.data(), n * sizeof(T));
  }
  v.resize(n);
}

}  // namespace tandem
