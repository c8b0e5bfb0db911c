// The one-rank device communicator (comm/one_rank_device_communicator.h): the communicator
// contract (communicator_contract.h) over device memory, on every device this machine has
// (the cpu device always; the cuda device on a GPU, and in the emulated-GPU build), and
// the copies going through the device's stream, not the host.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/communicator_contract.h"
#include "support/over_device_memory.h"
#include "support/test_util.h"
#include "tandem/comm/one_rank_device_communicator.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"

namespace tandem {
namespace {

class OneRankDeviceCommunicator : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
      device_ = make_cuda_device({.memory_bytes = 64 << 20});
    } else {
      device_ = make_cpu_device({.memory_bytes = 64 << 20});
    }
    comm_ = make_one_rank_device_communicator(*device_);
    host_ = std::make_unique<testing::OverDeviceMemory>(*comm_, *device_);
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_, host_;
};

TEST_P(OneRankDeviceCommunicator, IsAWorldOfOneRank) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  EXPECT_EQ(comm_->backend(), "one-rank device");
}

TEST_P(OneRankDeviceCommunicator, HoldsTheCommunicatorContract) {
  testing::check_all_reduce(*host_);
  testing::check_all_reduce_short(*host_);
  testing::check_reduce_scatter(*host_);
  testing::check_reduce_sum(*host_);
  testing::check_bf16_sums(*host_);
  testing::check_gather_and_broadcast(*host_);
  testing::check_point_to_point(*host_);
  testing::check_bad_arguments(*host_);
  testing::check_timeout_setting(*host_);
  host_->barrier();
  EXPECT_EQ(host_->traffic().bytes_sent, 0u);
  EXPECT_EQ(host_->traffic().bytes_received, 0u);
}

// Out-of-place calls copy on the device, in place they leave the data as it is: each
// result is the input's bits, whatever they are (a NaN's payload, -0).
TEST_P(OneRankDeviceCommunicator, EveryCollectiveOfOneRankIsItsOwnData) {
  std::vector<float> x = testing::rank_data(0, 257);
  x[3] = -0.0f;
  x[4] = std::bit_cast<float>(0x7fc01234u);
  const size_t bytes = x.size() * sizeof(float);
  std::vector<float> out(x.size(), 1.0f);
  host_->reduce_scatter_sum(x.data(), out.data(), x.size());
  EXPECT_EQ(std::memcmp(out.data(), x.data(), bytes), 0) << "reduce_scatter_sum";
  out.assign(x.size(), 1.0f);
  host_->reduce_sum(x.data(), out.data(), x.size(), 0);
  EXPECT_EQ(std::memcmp(out.data(), x.data(), bytes), 0) << "reduce_sum";
  out = x;
  host_->all_reduce_sum(out.data(), out.size());
  EXPECT_EQ(std::memcmp(out.data(), x.data(), bytes), 0) << "all_reduce_sum";
  out.assign(x.size(), 1.0f);
  host_->all_gather(x.data(), out.data(), bytes);
  EXPECT_EQ(std::memcmp(out.data(), x.data(), bytes), 0) << "all_gather";
}

INSTANTIATE_TEST_SUITE_P(EveryDevice, OneRankDeviceCommunicator, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
