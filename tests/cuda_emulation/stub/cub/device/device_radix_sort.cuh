// Stands in for CUB's device_radix_sort.cuh in emulated builds (see ../../../README.md):
// DeviceRadixSort::SortPairs as a stable sort on the host, with CUB's protocol for the
// temporary storage (a call with d_temp_storage == nullptr only reports the bytes needed;
// a later call must pass at least that many).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  // Sorts num_items (key, value) pairs by bits [begin_bit, end_bit) of the unsigned keys,
  // stably: pairs with equal key bits keep their order, as CUB's radix sort does.
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const KeyT* d_keys_in, KeyT* d_keys_out, const ValueT* d_values_in,
                               ValueT* d_values_out, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = nullptr) {
    static_assert(std::is_unsigned_v<KeyT>, "the emulated SortPairs takes unsigned keys only");
    const size_t n = num_items > 0 ? static_cast<size_t>(num_items) : 0;
    // What CUB needs is of this order: room for a second copy of keys and values.
    const size_t needed = 256 + n * (sizeof(KeyT) + sizeof(ValueT));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (temp_storage_bytes < needed || begin_bit < 0 ||
        end_bit > static_cast<int>(8 * sizeof(KeyT)) || begin_bit >= end_bit) {
      return cudaErrorInvalidValue;
    }
    // In stream order (../emulated_streams.h).
    cuda_emulation::stream_scheduler().submit(stream, [=] {
      // The storage must be writable device memory of the size promised: scribble on it.
      std::memset(d_temp_storage, 0xa5, temp_storage_bytes);
      const int width = end_bit - begin_bit;
      const uint64_t mask = width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
      const auto bits = [&](KeyT key) { return (static_cast<uint64_t>(key) >> begin_bit) & mask; };
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return bits(d_keys_in[a]) < bits(d_keys_in[b]); });
      const std::vector<KeyT> keys(d_keys_in, d_keys_in + n);
      const std::vector<ValueT> values(d_values_in, d_values_in + n);
      for (size_t i = 0; i < n; i++) {
        d_keys_out[i] = keys[order[i]];
        d_values_out[i] = values[order[i]];
      }
    });
    return cudaSuccess;
  }
};

}  // namespace cub
