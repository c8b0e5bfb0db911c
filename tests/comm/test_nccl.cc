// The NCCL communicator (comm/nccl_communicator.h).
//
// Everywhere (CI has no GPU): NcclWithoutGpu (asking for NCCL is a one-line error, on
// every rank of a larger world too) and NcclPlacement (which GPU each rank takes, and the
// one-line errors of a bad placement).
// On a GPU (bench/gpu_goals.sh runs NcclOnOneGpu.*; they skip, saying why, elsewhere): the
// communicator contract (tests/support/communicator_contract.h) at world size 1 through NCCL, over
// host buffers copied to and from the device (tests/support/over_device_memory.h); an all-reduce of
// megabytes of device data; the device tree sum against tree_sum for 1 to 9 parts, denormals
// included; a missing libnccl; more ranks than GPUs. NcclOnSeveralGpus: the contract on 2 or more
// GPUs, one rank per GPU on threads of this process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/communicator_contract.h"
#include "support/over_device_memory.h"
#include "support/test_util.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/nccl_communicator.h"
#include "tandem/comm/tree_sum.h"
#include "tandem/core/rng.h"
#include "tandem/device/cuda/cuda_device.h"

#if TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem {
namespace {

using testing::error_of;

// The message of make_nccl_communicator on each of `world` in-process ranks ("" where it
// made a communicator).
std::vector<std::string> make_errors(int world) {
  std::vector<std::string> errors(world);
  std::mutex mutex;
  run_local_ranks(world, [&](Communicator& bootstrap) {
    std::string message;
    try {
      make_nccl_communicator(bootstrap);
    } catch (const Error& e) {
      message = e.what();
    }
    std::lock_guard<std::mutex> lock(mutex);
    errors[bootstrap.rank()] = message;
  });
  return errors;
}

void expect_no_gpu_error(const std::string& message) {
  if (nccl_available()) {
    EXPECT_CONTAINS(message, "NCCL needs a GPU per rank; this machine (host ");
    EXPECT_CONTAINS(message, ") has none (cudaGetDeviceCount: ");
    EXPECT_CONTAINS(message, "); run the MPI backend on the cpu device");
  } else {
    EXPECT_CONTAINS(message,
                    "this tandem was built without NCCL (no CUDA toolkit with nccl.h at "
                    "configure time)");
  }
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(NcclWithoutGpu, AskingForNcclIsAOneLineError) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "this machine has a GPU (NcclOnOneGpu runs)";
  std::cout << "nccl_available(): " << nccl_available() << "; no GPU: " << why << "\n";
  LocalGroup single(1);
  std::unique_ptr<Communicator> bootstrap = single.communicator(0);
  const std::string message = error_of([&] { make_nccl_communicator(*bootstrap); });
  std::cout << message << "\n";
  expect_no_gpu_error(message);
}

TEST(NcclWithoutGpu, EveryRankOfALargerWorldFailsAtOnce) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU (NcclOnOneGpu runs)";
  for (const std::string& message : make_errors(3)) expect_no_gpu_error(message);
}

NcclRankPlace place(const std::string& host, int gpus, const std::string& visible = "") {
  NcclRankPlace p;
  p.host = host;
  p.gpu_count = gpus;
  p.visible_devices = visible;
  if (gpus == 0) p.no_gpu_reason = "cudaGetDeviceCount: no CUDA-capable device is detected";
  return p;
}

TEST(NcclPlacement, RanksOfAHostTakeItsGpusInRankOrder) {
  // Two hosts of 4 GPUs, ranks alternating between them.
  std::vector<NcclRankPlace> places;
  for (int r = 0; r < 8; r++) places.push_back(place(r % 2 == 0 ? "a" : "b", 4));
  for (int r = 0; r < 8; r++) EXPECT_EQ(nccl_device_of_rank(places, r), r / 2) << "rank " << r;
  // One rank alone.
  EXPECT_EQ(nccl_device_of_rank({place("a", 1)}, 0), 0);
}

TEST(NcclPlacement, RanksGivenTheirOwnVisibleDevicesTakeDeviceZero) {
  // A launcher that sets CUDA_VISIBLE_DEVICES per rank: each sees one GPU.
  std::vector<NcclRankPlace> places;
  for (int r = 0; r < 4; r++) places.push_back(place("a", 1, std::to_string(r)));
  for (int r = 0; r < 4; r++) EXPECT_EQ(nccl_device_of_rank(places, r), 0);
  // Two ranks that both see only GPU 1: one too many.
  places[2].visible_devices = "1";
  EXPECT_EQ(error_of([&] { nccl_device_of_rank(places, 0); }),
            "rank 2 is the 2nd rank on host a, which has 1 GPU (CUDA_VISIBLE_DEVICES=1); start at "
            "most one rank per GPU (mpirun --map-by ppr:1:node)");
}

TEST(NcclPlacement, MoreRanksOnAHostThanGpusFailsOnEveryRank) {
  std::vector<NcclRankPlace> places;
  for (int r = 0; r < 6; r++) places.push_back(place(r == 0 ? "b" : "a", 4));
  // Ranks 1..4 are the 1st to 4th on host a; rank 5 is its 5th. Every rank says so.
  for (int r = 0; r < 6; r++) {
    EXPECT_EQ(error_of([&] { nccl_device_of_rank(places, r); }),
              "rank 5 is the 5th rank on host a, which has 4 GPUs; start at most one rank per "
              "GPU (mpirun --map-by ppr:4:node)");
  }
  // Ordinals past the 4th: `extra` ranks on a host of extra - 1 GPUs.
  for (int extra : {3, 11, 12, 13, 21, 22, 23}) {
    const std::vector<NcclRankPlace> crowded(extra, place("h", extra - 1));
    const char* suffix = extra == 3 || extra == 23 ? "rd"
                         : extra == 21             ? "st"
                         : extra == 22             ? "nd"
                                                   : "th";
    EXPECT_CONTAINS(error_of([&] { nccl_device_of_rank(crowded, 0); }),
                    cat("rank ", extra - 1, " is the ", extra, suffix, " rank on host h"));
  }
}

TEST(NcclPlacement, ARankWithoutAGpuIsNamedByEveryRank) {
  std::vector<NcclRankPlace> places = {place("a", 2), place("a", 2), place("b", 0), place("c", 0)};
  EXPECT_EQ(error_of([&] { nccl_device_of_rank(places, 0); }),
            "NCCL needs a GPU per rank; rank 2's machine (host b) has none (cudaGetDeviceCount: "
            "no CUDA-capable device is detected); run the MPI backend on the cpu device");
  EXPECT_CONTAINS(error_of([&] { nccl_device_of_rank(places, 3); }),
                  "NCCL needs a GPU per rank; this machine (host c) has none");
  EXPECT_CONTAINS(error_of([&] { nccl_device_of_rank(places, 4); }),
                  "rank 4 is not a rank of a world of 4");
}

#if TANDEM_HAVE_CUDA

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(code));
}

// cudaMalloc'ed bytes, freed with it.
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes) {
    if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* get() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }

 private:
  void* data_ = nullptr;
};

void to_device(void* device, const void* host, size_t bytes) {
  if (bytes > 0) check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
void to_host(void* host, const void* device, size_t bytes) {
  if (bytes > 0) check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

// Values of many magnitudes, whose sums depend on the order of the additions; with
// `denormals`, values near the smallest normal float whose sums are denormal.
std::vector<float> mixed_values(size_t n, uint64_t seed, bool denormals) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    if (denormals) {
      v = rng.normal() * std::numeric_limits<float>::min();
    } else {
      v = rng.normal() * std::ldexp(1.0f, static_cast<int>(rng.next_u64() % 40) - 20);
    }
  }
  return x;
}

// The reason to skip a GPU test here ("" where it can run).
std::string why_no_gpu(int gpus_needed) {
  std::string why;
  const int gpus = cuda_device_count(&why);
  if (gpus == 0) return "no GPU to run on: " + why;
  if (gpus < gpus_needed) return cat("needs ", gpus_needed, " GPUs, this machine has ", gpus);
  if (!nccl_available()) return "this tandem was built without NCCL";
  return "";
}

// World size 1 through NCCL: one communicator for the whole suite (NCCL is started once).
class NcclOnOneGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!why_no_gpu(1).empty()) return;
    bootstrap_group_ = std::make_unique<LocalGroup>(1);
    bootstrap_ = bootstrap_group_->communicator(0);
    try {
      nccl_ = make_nccl_communicator(*bootstrap_);
      device_ = make_cuda_device({.device_index = nccl_communicator_device(*nccl_)});
      host_ = std::make_unique<testing::OverDeviceMemory>(*nccl_, *device_);
    } catch (const Error& e) {
      failure_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    host_.reset();
    device_.reset();
    nccl_.reset();
    bootstrap_.reset();
    bootstrap_group_.reset();
  }
  void SetUp() override {
    if (const std::string why = why_no_gpu(1); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(failure_.empty()) << "make_nccl_communicator failed: " << failure_;
  }

  static std::unique_ptr<LocalGroup> bootstrap_group_;
  static std::unique_ptr<Communicator> bootstrap_, nccl_, host_;
  static std::unique_ptr<Device> device_;
  static std::string failure_;
};
std::unique_ptr<LocalGroup> NcclOnOneGpu::bootstrap_group_;
std::unique_ptr<Communicator> NcclOnOneGpu::bootstrap_;
std::unique_ptr<Communicator> NcclOnOneGpu::nccl_;
std::unique_ptr<Communicator> NcclOnOneGpu::host_;
std::unique_ptr<Device> NcclOnOneGpu::device_;
std::string NcclOnOneGpu::failure_;

TEST_F(NcclOnOneGpu, IsTheNcclBackendOfOneRank) {
  EXPECT_EQ(nccl_->backend(), "nccl");
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->world_size(), 1);
}
TEST_F(NcclOnOneGpu, AllReduceSumsInTreeOrder) { testing::check_all_reduce(*host_); }
TEST_F(NcclOnOneGpu, AllReduceOfFewerValuesThanRanks) { testing::check_all_reduce_short(*host_); }
TEST_F(NcclOnOneGpu, ReduceScatterGivesEachRankItsSlice) { testing::check_reduce_scatter(*host_); }
TEST_F(NcclOnOneGpu, ReduceSumGivesEveryRootTheTreeSum) { testing::check_reduce_sum(*host_); }
TEST_F(NcclOnOneGpu, Bf16SumsRoundEveryAdditionOfTheTree) { testing::check_bf16_sums(*host_); }
TEST_F(NcclOnOneGpu, AllGatherAndBroadcastFromEveryRoot) {
  testing::check_gather_and_broadcast(*host_);
}
TEST_F(NcclOnOneGpu, PointToPointToItselfIsRefused) { testing::check_point_to_point(*host_); }
TEST_F(NcclOnOneGpu, BadPeersAndRootsAreRefused) { testing::check_bad_arguments(*host_); }
TEST_F(NcclOnOneGpu, TimeoutIsSetPerCommunicator) { testing::check_timeout_setting(*host_); }

// Megabytes of device data, all-reduced on the device: tree_sum's bits on the host.
TEST_F(NcclOnOneGpu, AllReduceOfMegabytesOnTheDeviceIsTheTreeSum) {
  const size_t n = 3 * (size_t{1} << 20) + 7;
  const std::vector<float> x = mixed_values(n, 11, false);
  DeviceArray d(n * sizeof(float));
  to_device(d.get(), x.data(), n * sizeof(float));
  nccl_->all_reduce_sum(d.floats(), n);
  std::vector<float> got(n), want(n);
  to_host(got.data(), d.get(), n * sizeof(float));
  const float* parts[1] = {x.data()};
  tree_sum(parts, 1, n, want.data());
  EXPECT_TRUE(testing::same_bits(got, want));
  // All-gather of device bytes, and one in place.
  DeviceArray all(n * sizeof(float));
  nccl_->all_gather(d.get(), all.get(), n * sizeof(float));
  to_host(got.data(), all.get(), n * sizeof(float));
  EXPECT_TRUE(testing::same_bits(got, want));
  nccl_->all_gather(all.get(), all.get(), n * sizeof(float));
  to_host(got.data(), all.get(), n * sizeof(float));
  EXPECT_TRUE(testing::same_bits(got, want));
}

// The sum the backend computes on the device, for every count of parts a world of up to
// 9 ranks sums: tree_sum's bits, one saxpy per pair.
TEST_F(NcclOnOneGpu, DeviceTreeSumIsTreeSumBitForBit) {
  const size_t n = (size_t{1} << 20) + 3;
  for (bool denormals : {false, true}) {
    for (int count = 1; count <= 9; count++) {
      SCOPED_TRACE(::testing::Message() << count << " parts, denormals " << denormals);
      std::vector<std::vector<float>> parts;
      std::vector<const float*> pointers;
      for (int k = 0; k < count; k++) parts.push_back(mixed_values(n, 100 * count + k, denormals));
      for (const std::vector<float>& part : parts) pointers.push_back(part.data());
      std::vector<float> want(n), got(n);
      tree_sum(pointers.data(), count, n, want.data());
      DeviceArray slots(count * n * sizeof(float));
      for (int k = 0; k < count; k++)
        to_device(slots.floats() + k * n, parts[k].data(), n * sizeof(float));
      nccl_tree_sum_on_device(slots.floats(), count, n);
      to_host(got.data(), slots.get(), n * sizeof(float));
      EXPECT_TRUE(testing::same_bits(got, want));
      if (denormals) {
        size_t subnormal = 0;
        for (float v : want) subnormal += std::fpclassify(v) == FP_SUBNORMAL;
        EXPECT_GT(subnormal, n / 10) << "the check needs denormal sums";
      }
    }
  }
}

// The same in bf16: every pairwise addition in fp32 and rounded to bf16, tree_sum's bits.
TEST_F(NcclOnOneGpu, DeviceBf16TreeSumIsTreeSumBitForBit) {
  const size_t n = (size_t{1} << 20) + 3;
  for (int count = 1; count <= 9; count++) {
    SCOPED_TRACE(::testing::Message() << count << " bf16 parts");
    std::vector<std::vector<Bf16>> parts;
    std::vector<const Bf16*> pointers;
    for (int k = 0; k < count; k++) {
      const std::vector<float> wide = mixed_values(n, 300 * count + k, false);
      std::vector<Bf16> part(n);
      for (size_t i = 0; i < n; i++) part[i] = from_float<Bf16>(wide[i]);
      parts.push_back(std::move(part));
    }
    for (const std::vector<Bf16>& part : parts) pointers.push_back(part.data());
    std::vector<Bf16> want(n), got(n);
    tree_sum(pointers.data(), count, n, want.data());
    DeviceArray slots(count * n * sizeof(Bf16));
    for (int k = 0; k < count; k++)
      to_device(static_cast<Bf16*>(slots.get()) + k * n, parts[k].data(), n * sizeof(Bf16));
    nccl_tree_sum_on_device(static_cast<Bf16*>(slots.get()), count, n);
    to_host(got.data(), slots.get(), n * sizeof(Bf16));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(Bf16)), 0);
  }
}

TEST_F(NcclOnOneGpu, AMissingLibraryIsAOneLineError) {
  const char* before = std::getenv(kNcclLibraryVariable);
  const std::string saved = before != nullptr ? before : "";
  setenv(kNcclLibraryVariable, "/nonexistent/libnccl.so.2", 1);
  LocalGroup single(1);
  std::unique_ptr<Communicator> bootstrap = single.communicator(0);
  const std::string message = error_of([&] { make_nccl_communicator(*bootstrap); });
  if (before != nullptr) {
    setenv(kNcclLibraryVariable, saved.c_str(), 1);
  } else {
    unsetenv(kNcclLibraryVariable);
  }
  EXPECT_CONTAINS(message, "cannot load the NCCL library /nonexistent/libnccl.so.2 (");
  EXPECT_CONTAINS(message, "LD_LIBRARY_PATH");
  EXPECT_CONTAINS(message, "libnccl2");
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST_F(NcclOnOneGpu, MoreRanksThanGpusIsRefusedOnEveryRank) {
  const int gpus = cuda_device_count();
  const std::vector<std::string> errors = make_errors(gpus + 1);
  for (const std::string& message : errors) {
    EXPECT_CONTAINS(message, cat("rank ", gpus, " is the ", gpus + 1));
    EXPECT_CONTAINS(message, cat("start at most one rank per GPU (mpirun --map-by ppr:", gpus));
  }
}

// One rank per GPU (up to 4), on threads of this process, bootstrapped by a LocalGroup.
TEST(NcclOnSeveralGpus, ContractHoldsOnEveryRank) {
  if (const std::string why = why_no_gpu(2); !why.empty()) GTEST_SKIP() << why;
  const int world = std::min(cuda_device_count(), 4);
  run_local_ranks(world, [&](Communicator& bootstrap) {
    std::unique_ptr<Communicator> nccl = make_nccl_communicator(bootstrap);
    const std::unique_ptr<Device> device =
        make_cuda_device({.device_index = nccl_communicator_device(*nccl)});
    testing::OverDeviceMemory comm(*nccl, *device);
    EXPECT_EQ(comm.world_size(), world);
    testing::check_all_reduce(comm);
    testing::check_all_reduce_short(comm);
    testing::check_reduce_scatter(comm);
    testing::check_reduce_sum(comm);
    testing::check_bf16_sums(comm);
    testing::check_gather_and_broadcast(comm);
    testing::check_point_to_point(comm);
    testing::check_bad_arguments(comm);
    comm.barrier();
  });
}

#else  // !TANDEM_HAVE_CUDA

TEST(NcclOnOneGpu, NeedsCuda) { GTEST_SKIP() << "tandem was built without CUDA"; }

#endif

}  // namespace
}  // namespace tandem
