// A test fixture on the cuda device: skipped, printing why, where there is no GPU; with a
// stream and helpers to move vectors to and from device memory.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"

namespace tandem::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
    device_ = make_cuda_device({});
    stream_ = device_->create_stream("test");
  }
  // Host vector -> new device allocation.
  template <typename T>
  DeviceAllocation upload(const std::vector<T>& host) {
    DeviceAllocation a = device_->allocate(MemorySpace::kDevice, host.size() * sizeof(T));
    device_->copy_async(a.data(), host.data(), host.size() * sizeof(T), *stream_);
    stream_->synchronize();
    return a;
  }
  template <typename T>
  std::vector<T> download(const DeviceAllocation& a, size_t n) {
    std::vector<T> host(n);
    device_->copy_async(host.data(), a.data(), n * sizeof(T), *stream_);
    stream_->synchronize();
    return host;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace tandem::testing
