// The Communicator contract (dist/communicator.h) as checks that run on one rank of any
// backend: each rank calls the same check with its communicator, as the collectives need.
// test_dist.cc runs them on in-process ranks, test_dist_mpi.cc on real MPI ranks.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tandem/core/rng.h"
#include "tandem/dist/communicator.h"
#include "test_util.h"

namespace tandem::testing {

// Rank r's data: values whose sum depends on the order of the additions.
inline std::vector<float> rank_data(int rank, size_t n) {
  Rng rng(1000 + rank);
  std::vector<float> x(n);
  for (float& v : x) v = rng.normal() * (rank % 2 == 0 ? 1e4f : 1e-3f);
  return x;
}

// ((x_0 + x_1) + x_2) + ...
inline std::vector<float> sum_in_rank_order(int world, size_t n) {
  std::vector<float> sum = rank_data(0, n);
  for (int r = 1; r < world; r++) {
    const std::vector<float> x = rank_data(r, n);
    for (size_t i = 0; i < n; i++) sum[i] += x[i];
  }
  return sum;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// All-reduce of a length no world size divides: the rank-order sum, to the bit.
inline void check_all_reduce(Communicator& comm) {
  const size_t n = 1001;
  std::vector<float> x = rank_data(comm.rank(), n);
  const CommunicatorTraffic before = comm.traffic();
  comm.all_reduce_sum(x.data(), n);
  EXPECT_TRUE(same_bits(x, sum_in_rank_order(comm.world_size(), n))) << "rank " << comm.rank();
  // About 2 (N - 1) / N of the data each way, as a ring moves it.
  const double ring = 2.0 * (comm.world_size() - 1) * n * sizeof(float) / comm.world_size();
  const double sent = static_cast<double>(comm.traffic().bytes_sent - before.bytes_sent);
  EXPECT_NEAR(sent, ring, 2.0 * comm.world_size() * sizeof(float) + 1) << comm.backend();
}

inline void check_reduce_scatter(Communicator& comm) {
  const size_t count = 37;
  const int world = comm.world_size();
  const std::vector<float> want = sum_in_rank_order(world, world * count);
  const std::vector<float> x = rank_data(comm.rank(), world * count);
  std::vector<float> slice(count);
  comm.reduce_scatter_sum(x.data(), slice.data(), count);
  const std::vector<float> expected(want.begin() + comm.rank() * count,
                                    want.begin() + (comm.rank() + 1) * count);
  EXPECT_TRUE(same_bits(slice, expected)) << "rank " << comm.rank();
}

inline void check_gather_and_broadcast(Communicator& comm) {
  const int world = comm.world_size();
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
}

// Around a ring, three messages each, in order; with one rank, a send to itself is refused.
inline void check_point_to_point(Communicator& comm) {
  const int world = comm.world_size();
  if (world == 1) {
    int x = 0;
    EXPECT_CONTAINS(error_of([&] { comm.send(&x, sizeof(x), 0, 7); }), "is not another rank");
    return;
  }
  const int next = (comm.rank() + 1) % world, prev = (comm.rank() + world - 1) % world;
  // Even ranks send first, odd ranks receive first: no rank blocks on a send nobody takes.
  const auto send_all = [&] {
    for (int i = 0; i < 3; i++) {
      const int message = 100 * comm.rank() + i;
      comm.send(&message, sizeof(message), next, 7);
    }
  };
  const auto recv_all = [&] {
    for (int i = 0; i < 3; i++) {
      int got = -1;
      comm.recv(&got, sizeof(got), prev, 7);
      EXPECT_EQ(got, 100 * prev + i);
    }
  };
  if (comm.rank() % 2 == 0) {
    send_all();
    recv_all();
  } else {
    recv_all();
    send_all();
  }
}

inline void check_bad_arguments(Communicator& comm) {
  int x = 0;
  EXPECT_CONTAINS(error_of([&] { comm.send(&x, sizeof(x), comm.rank(), 0); }),
                  "is not another rank");
  EXPECT_CONTAINS(error_of([&] { comm.broadcast(&x, sizeof(x), comm.world_size()); }),
                  "is not a rank of a world of");
}

}  // namespace tandem::testing
