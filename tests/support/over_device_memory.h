// A device-memory communicator seen through host buffers, so that the host contract checks
// (communicator_contract.h) run on it unchanged: each call copies its host buffers into
// memory of `device` (kDevice), calls the communicator there, and copies the results back.
// In-place calls stay in place on the device; a null recv stays null; a recv buffer goes
// to the device first, so that one the backend must leave alone comes back unchanged.
// Used for NCCL (test_nccl.cc) and the one-rank device communicator
// (test_one_rank_device_communicator.cc).
#pragma once

#include <algorithm>
#include <memory>

#include "tandem/comm/communicator.h"
#include "tandem/device/device.h"

namespace tandem::testing {

class OverDeviceMemory final : public Communicator {
 public:
  OverDeviceMemory(Communicator& on_device, Device& device)
      : comm_(on_device), device_(device), stream_(device.create_stream("test copies")) {}

  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  std::string_view backend() const override { return comm_.backend(); }

  void all_reduce_sum(float* data, size_t n) override {
    DeviceAllocation d = to_device(data, n * sizeof(float));
    comm_.all_reduce_sum(d.as<float>(), n);
    to_host(data, d, n * sizeof(float));
  }
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    const size_t all = world_size() * count * sizeof(float);
    DeviceAllocation d_send = to_device(send, all), d_recv = make(count * sizeof(float));
    comm_.reduce_scatter_sum(d_send.as<float>(), d_recv.as<float>(), count);
    to_host(recv, d_recv, count * sizeof(float));
  }
  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    reduce(send, recv, n, [&](const float* s, float* r) { comm_.reduce_sum(s, r, n, root); });
  }
  void all_reduce_sum_bf16(Bf16* data, size_t n) override {
    DeviceAllocation d = to_device(data, n * sizeof(Bf16));
    comm_.all_reduce_sum_bf16(d.as<Bf16>(), n);
    to_host(data, d, n * sizeof(Bf16));
  }
  void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) override {
    reduce(send, recv, n, [&](const Bf16* s, Bf16* r) { comm_.reduce_sum_bf16(s, r, n, root); });
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    DeviceAllocation d_send = to_device(send, bytes), d_recv = make(world_size() * bytes);
    comm_.all_gather(d_send.as<void>(), d_recv.as<void>(), bytes);
    to_host(recv, d_recv, world_size() * bytes);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    DeviceAllocation d = to_device(data, bytes);
    comm_.broadcast(d.as<void>(), bytes, root);
    to_host(data, d, bytes);
  }
  void barrier() override { comm_.barrier(); }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    DeviceAllocation d = to_device(data, bytes);
    comm_.send(d.as<void>(), bytes, peer, tag);
    traffic_ = comm_.traffic();
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    DeviceAllocation d = make(bytes);
    comm_.recv(d.as<void>(), bytes, peer, tag);
    to_host(data, d, bytes);
  }
  void abort() noexcept override { comm_.abort(); }
  void set_timeout(std::chrono::milliseconds timeout) override {
    Communicator::set_timeout(timeout);
    comm_.set_timeout(timeout);
  }

 private:
  // At least one byte: a call of zero elements still gets a distinct device pointer.
  DeviceAllocation make(size_t bytes) {
    return device_.allocate(MemorySpace::kDevice, std::max<size_t>(bytes, 1));
  }
  DeviceAllocation to_device(const void* host, size_t bytes) {
    DeviceAllocation d = make(bytes);
    if (bytes > 0) {
      device_.copy_async(d.as<void>(), host, bytes, *stream_);
      stream_->synchronize();
    }
    return d;
  }
  // Copies the result back and takes the traffic the device communicator counted.
  void to_host(void* host, DeviceAllocation& d, size_t bytes) {
    if (bytes > 0) {
      device_.copy_async(host, d.as<void>(), bytes, *stream_);
      stream_->synchronize();
    }
    traffic_ = comm_.traffic();
  }
  template <typename T, typename Call>
  void reduce(const T* send, T* recv, size_t n, Call&& call) {
    const size_t bytes = n * sizeof(T);
    DeviceAllocation d_send = to_device(send, bytes);
    DeviceAllocation d_recv = recv != nullptr && recv != send ? to_device(recv, bytes) : make(0);
    T* device_recv = recv == nullptr ? nullptr : recv == send ? d_send.as<T>() : d_recv.as<T>();
    call(d_send.as<T>(), device_recv);
    if (recv != nullptr) {
      to_host(recv, recv == send ? d_send : d_recv, bytes);
    } else {
      traffic_ = comm_.traffic();
    }
  }

  Communicator& comm_;
  Device& device_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace tandem::testing
