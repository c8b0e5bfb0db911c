// The communicator contract (dist/communicator.h) on the in-process backend, for world
// sizes 1 to 5 and lengths that do not divide by them: rank-order sums to the bit,
// gathers and broadcasts from every root, point to point in order, the traffic counted as
// a ring moves it, and a failing rank that does not hang the others.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "tandem/core/rng.h"
#include "tandem/dist/local_group.h"
#include "test_util.h"

namespace tandem {
namespace {

// Rank r's data: values whose sum depends on the order of the additions.
std::vector<float> rank_data(int rank, size_t n) {
  Rng rng(1000 + rank);
  std::vector<float> x(n);
  for (float& v : x) v = rng.normal() * (rank % 2 == 0 ? 1e4f : 1e-3f);
  return x;
}

// ((x_0 + x_1) + x_2) + ...
std::vector<float> sum_in_rank_order(int world, size_t n) {
  std::vector<float> sum = rank_data(0, n);
  for (int r = 1; r < world; r++) {
    const std::vector<float> x = rank_data(r, n);
    for (size_t i = 0; i < n; i++) sum[i] += x[i];
  }
  return sum;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class LocalCommunicator : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommunicator, AllReduceSumsInRankOrder) {
  const int world = GetParam();
  const size_t n = 1001;
  const std::vector<float> want = sum_in_rank_order(world, n);
  run_local_ranks(world, [&](Communicator& comm) {
    std::vector<float> x = rank_data(comm.rank(), n);
    comm.all_reduce_sum(x.data(), n);
    EXPECT_TRUE(same_bits(x, want)) << "rank " << comm.rank();
    const size_t ring = 2 * (world - 1) * n * sizeof(float) / world;
    EXPECT_EQ(comm.traffic().bytes_sent, ring);
    EXPECT_EQ(comm.traffic().bytes_received, ring);
  });
}

TEST_P(LocalCommunicator, ReduceScatterGivesEachRankItsSlice) {
  const int world = GetParam();
  const size_t count = 37;
  const std::vector<float> want = sum_in_rank_order(world, world * count);
  run_local_ranks(world, [&](Communicator& comm) {
    const std::vector<float> x = rank_data(comm.rank(), world * count);
    std::vector<float> slice(count);
    comm.reduce_scatter_sum(x.data(), slice.data(), count);
    const std::vector<float> expected(want.begin() + comm.rank() * count,
                                      want.begin() + (comm.rank() + 1) * count);
    EXPECT_TRUE(same_bits(slice, expected)) << "rank " << comm.rank();
  });
}

TEST_P(LocalCommunicator, AllGatherAndBroadcastFromEveryRoot) {
  const int world = GetParam();
  run_local_ranks(world, [&](Communicator& comm) {
    const int mine[3] = {comm.rank(), 10 * comm.rank(), -comm.rank()};
    std::vector<int> all(3 * world, -99);
    comm.all_gather(mine, all.data(), sizeof(mine));
    for (int r = 0; r < world; r++) {
      EXPECT_EQ(all[3 * r], r);
      EXPECT_EQ(all[3 * r + 1], 10 * r);
      EXPECT_EQ(all[3 * r + 2], -r);
    }
    for (int root = 0; root < world; root++) {
      double value = comm.rank() == root ? 0.5 + root : -1.0;
      comm.broadcast(&value, sizeof(value), root);
      EXPECT_EQ(value, 0.5 + root) << "root " << root << ", rank " << comm.rank();
    }
    comm.barrier();
  });
}

TEST_P(LocalCommunicator, PointToPointArrivesInOrder) {
  const int world = GetParam();
  run_local_ranks(world, [&](Communicator& comm) {
    if (world == 1) {  // no other rank to talk to
      int x = 0;
      EXPECT_CONTAINS(testing::error_of([&] { comm.send(&x, sizeof(x), 0, 7); }),
                      "is not another rank");
      return;
    }
    const int next = (comm.rank() + 1) % world, prev = (comm.rank() + world - 1) % world;
    for (int i = 0; i < 3; i++) {
      const int message = 100 * comm.rank() + i;
      comm.send(&message, sizeof(message), next, 7);
    }
    for (int i = 0; i < 3; i++) {
      int got = -1;
      comm.recv(&got, sizeof(got), prev, 7);
      EXPECT_EQ(got, 100 * prev + i);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LocalCommunicator, ::testing::Values(1, 2, 3, 4, 5));

TEST(LocalCommunicatorFailure, AFailingRankAbortsTheOthersInsteadOfHangingThem) {
  std::atomic<int> aborted = 0;
  const std::string message = testing::error_of([&] {
    run_local_ranks(3, [&](Communicator& comm) {
      if (comm.rank() == 1) fail("rank 1 fails on purpose");
      std::vector<float> x(8, 1.0f);
      try {
        comm.all_reduce_sum(x.data(), x.size());
      } catch (const Error&) {
        aborted++;
        throw;
      }
    });
  });
  EXPECT_CONTAINS(message, "rank 1 fails on purpose");
  EXPECT_EQ(aborted.load(), 2);
}

TEST(LocalCommunicatorFailure, BadPeersAndRootsAreRefused) {
  run_local_ranks(2, [&](Communicator& comm) {
    int x = 0;
    EXPECT_CONTAINS(testing::error_of([&] { comm.send(&x, sizeof(x), comm.rank(), 0); }),
                    "is not another rank");
    EXPECT_CONTAINS(testing::error_of([&] { comm.broadcast(&x, sizeof(x), 2); }),
                    "is not a rank of a world of 2");
  });
}

}  // namespace
}  // namespace tandem
