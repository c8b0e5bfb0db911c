#include "tandem/comm/one_rank_device_communicator.h"

#include "tandem/core/error.h"
#include "tandem/device/device.h"

namespace tandem {
namespace {

class OneRankDeviceCommunicator final : public Communicator {
 public:
  explicit OneRankDeviceCommunicator(Device& device)
      : device_(device), stream_(device.create_stream("one-rank communicator")) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view backend() const override { return "one-rank device"; }

  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum_bf16(Bf16*, size_t) override {}
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    copy(recv, send, count * sizeof(float));
  }
  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    check_root(root, "reduce_sum");
    copy(recv, send, n * sizeof(float));
  }
  void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) override {
    check_root(root, "reduce_sum_bf16");
    copy(recv, send, n * sizeof(Bf16));
  }
  void all_gather(const void* send, void* recv, size_t bytes) override { copy(recv, send, bytes); }
  void broadcast(void*, size_t, int root) override { check_root(root, "broadcast"); }
  void barrier() override {}
  void send(const void*, size_t, int peer, int) override { refuse_peer(peer); }
  void recv(void*, size_t, int peer, int) override { refuse_peer(peer); }
  void abort() noexcept override {}

 private:
  void copy(void* to, const void* from, size_t bytes) {
    if (to == from || bytes == 0) return;
    device_.copy_async(to, from, bytes, *stream_, "one-rank collective");
    stream_->synchronize();
  }
  static void check_root(int root, const char* what) {
    TANDEM_CHECK(root == 0, what, ": root ", root, " is not a rank of a world of 1");
  }
  [[noreturn]] static void refuse_peer(int peer) {
    fail("rank 0: peer ", peer, " is not another rank of a world of 1");
  }

  Device& device_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_one_rank_device_communicator(Device& device) {
  return std::make_unique<OneRankDeviceCommunicator>(device);
}

}  // namespace tandem
