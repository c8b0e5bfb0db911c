#include "tandem/device/device.h"

#include <utility>

namespace tandem {

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& other) noexcept {
  if (this != &other) {
    reset();
    // exchange() leaves `other` empty, so its destructor releases nothing.
    device_ = std::exchange(other.device_, nullptr);
    space_ = std::exchange(other.space_, MemorySpace::kHost);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceAllocation::reset() {
  // Clear before releasing so that the allocation is empty even if this is re-entered.
  Device* device = std::exchange(device_, nullptr);
  void* data = std::exchange(data_, nullptr);
  const size_t bytes = std::exchange(bytes_, 0);
  const MemorySpace space = std::exchange(space_, MemorySpace::kHost);
  if (device != nullptr) device->release(space, data, bytes);
}

}  // namespace tandem
