// The Communicator contract (comm/communicator.h) as checks that run on one rank of any
// backend: each rank calls the same check with its communicator, as the collectives need.
// test_local_ranks_and_tree_sum.cc runs them on in-process ranks, test_dist_mpi.cc on real MPI
// ranks.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/rng.h"

namespace tandem::testing {

// Rank r's data: values whose sum depends on the order of the additions.
inline std::vector<float> rank_data(int rank, size_t n) {
  Rng rng(1000 + rank);
  std::vector<float> x(n);
  for (float& v : x) v = rng.normal() * (rank % 2 == 0 ? 1e4f : 1e-3f);
  return x;
}

// The contract's tree (comm/tree_sum.h) over x[first, first + count), written here
// independently of tree_sum as its recursive form: the left subtree is the complete tree
// over the largest power of two below count, the right one the tree over the rest.
// (Level by level, the first 2^k values pair up among themselves k times before anything
// else meets them, and the rest reaches level k as one value.)
inline float tree_order_reference(const std::vector<float>& x, size_t first, size_t count) {
  if (count == 1) return x[first];
  size_t left = 1;
  while (2 * left < count) left *= 2;
  return tree_order_reference(x, first, left) + tree_order_reference(x, first + left, count - left);
}

// Element-wise tree sum over ranks 0 .. world - 1 of rank_data(r, n).
inline std::vector<float> sum_in_tree_order(int world, size_t n) {
  std::vector<std::vector<float>> data;
  for (int r = 0; r < world; r++) data.push_back(rank_data(r, n));
  std::vector<float> sum(n), column(world);
  for (size_t i = 0; i < n; i++) {
    for (int r = 0; r < world; r++) column[r] = data[r][i];
    sum[i] = tree_order_reference(column, 0, world);
  }
  return sum;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// All-reduce of a length no world size divides: the tree-order sum, to the bit.
inline void check_all_reduce(Communicator& comm) {
  const size_t n = 1001;
  std::vector<float> x = rank_data(comm.rank(), n);
  const CommunicatorTraffic before = comm.traffic();
  comm.all_reduce_sum(x.data(), n);
  EXPECT_TRUE(same_bits(x, sum_in_tree_order(comm.world_size(), n))) << "rank " << comm.rank();
  // About 2 (N - 1) / N of the data each way, as a ring moves it.
  const double ring = 2.0 * (comm.world_size() - 1) * n * sizeof(float) / comm.world_size();
  const double sent = static_cast<double>(comm.traffic().bytes_sent - before.bytes_sent);
  EXPECT_NEAR(sent, ring, 2.0 * comm.world_size() * sizeof(float) + 1) << comm.backend();
}

// All-reduce of lengths shorter than the world and just past it (empty and short slices).
inline void check_all_reduce_short(Communicator& comm) {
  for (size_t n = 0; n <= static_cast<size_t>(comm.world_size()) + 2; n++) {
    std::vector<float> x = rank_data(comm.rank(), n);
    comm.all_reduce_sum(x.data(), n);
    EXPECT_TRUE(same_bits(x, sum_in_tree_order(comm.world_size(), n)))
        << "n " << n << ", rank " << comm.rank();
  }
}

inline void check_reduce_scatter(Communicator& comm) {
  const size_t count = 37;
  const int world = comm.world_size();
  const std::vector<float> want = sum_in_tree_order(world, world * count);
  const std::vector<float> x = rank_data(comm.rank(), world * count);
  std::vector<float> slice(count);
  comm.reduce_scatter_sum(x.data(), slice.data(), count);
  const std::vector<float> expected(want.begin() + comm.rank() * count,
                                    want.begin() + (comm.rank() + 1) * count);
  EXPECT_TRUE(same_bits(slice, expected)) << "rank " << comm.rank();
}

// Reduce to every root in turn, of a length no world size divides: the root gets the
// tree-order sum to the bit, in place and from a separate send buffer; the send buffer is
// left alone; the other ranks' recv is untouched (and may be null); each rank counts
// (N - 1) / N of the data each way. Then one length past the MPI backend's 2^20-float
// pieces.
inline void check_reduce_sum(Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  const size_t n = 1001;
  const std::vector<float> mine = rank_data(rank, n);
  const std::vector<float> want = sum_in_tree_order(world, n);
  const std::vector<float> untouched(n, -7.0f);
  const double ring = 1.0 * (world - 1) * n * sizeof(float) / world;
  for (int root = 0; root < world; root++) {
    SCOPED_TRACE(::testing::Message() << "root " << root << ", rank " << rank);
    // From a separate send buffer.
    std::vector<float> recv = untouched;
    const CommunicatorTraffic before = comm.traffic();
    comm.reduce_sum(mine.data(), recv.data(), n, root);
    EXPECT_TRUE(same_bits(recv, rank == root ? want : untouched));
    EXPECT_TRUE(same_bits(mine, rank_data(rank, n)));
    const CommunicatorTraffic after = comm.traffic();
    EXPECT_NEAR(static_cast<double>(after.bytes_sent - before.bytes_sent), ring, 1.0);
    EXPECT_NEAR(static_cast<double>(after.bytes_received - before.bytes_received), ring, 1.0);
    // In place on the root; the others pass no recv at all.
    std::vector<float> data = mine;
    comm.reduce_sum(data.data(), rank == root ? data.data() : nullptr, n, root);
    EXPECT_TRUE(same_bits(data, rank == root ? want : mine));
  }
  const size_t large = (size_t{1} << 20) + 5;
  const int root = world - 1;
  std::vector<float> data = rank_data(rank, large);
  comm.reduce_sum(data.data(), data.data(), large, root);
  EXPECT_TRUE(
      same_bits(data, rank == root ? sum_in_tree_order(world, large) : rank_data(rank, large)))
      << "rank " << rank;
}

// bf16 sums (all-reduce and reduce to every root): the tree with every addition rounded to
// bf16, as the bf16 backends add (written here from to_float/from_float, not tree_sum).
inline Bf16 bf16_tree_reference(const std::vector<Bf16>& x, size_t first, size_t count) {
  if (count == 1) return x[first];
  size_t left = 1;
  while (2 * left < count) left *= 2;
  return from_float<Bf16>(to_float(bf16_tree_reference(x, first, left)) +
                          to_float(bf16_tree_reference(x, first + left, count - left)));
}

inline std::vector<Bf16> bf16_rank_data(int rank, size_t n) {
  const std::vector<float> wide = rank_data(rank, n);
  std::vector<Bf16> x(n);
  for (size_t i = 0; i < n; i++) x[i] = from_float<Bf16>(wide[i] * (i % 3 == 0 ? 1e-3f : 1.0f));
  return x;
}

inline bool same_bits(const std::vector<Bf16>& a, const std::vector<Bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Bf16)) == 0;
}

inline void check_bf16_sums(Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  const size_t n = 999;
  std::vector<std::vector<Bf16>> data;
  for (int r = 0; r < world; r++) data.push_back(bf16_rank_data(r, n));
  std::vector<Bf16> want(n), column(world);
  for (size_t i = 0; i < n; i++) {
    for (int r = 0; r < world; r++) column[r] = data[r][i];
    want[i] = bf16_tree_reference(column, 0, world);
  }
  std::vector<Bf16> x = data[rank];
  const CommunicatorTraffic before = comm.traffic();
  comm.all_reduce_sum_bf16(x.data(), n);
  EXPECT_TRUE(same_bits(x, want)) << "all-reduce, rank " << rank;
  // Half the bytes of an fp32 all-reduce.
  const double ring = 2.0 * (world - 1) * n * sizeof(Bf16) / world;
  EXPECT_NEAR(static_cast<double>(comm.traffic().bytes_sent - before.bytes_sent), ring,
              2.0 * world * sizeof(Bf16) + 1);
  for (int root = 0; root < world; root++) {
    std::vector<Bf16> in_place = data[rank];
    comm.reduce_sum_bf16(in_place.data(), rank == root ? in_place.data() : nullptr, n, root);
    EXPECT_TRUE(same_bits(in_place, rank == root ? want : data[rank]))
        << "reduce to " << root << ", rank " << rank;
  }
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

// The timeout: TANDEM_COMM_TIMEOUT_S or 600 s to start with, any positive time after
// set_timeout, 0 and negative ones refused (and the timeout left as it was).
inline void check_timeout_setting(Communicator& comm) {
  EXPECT_EQ(comm.timeout(), communicator_timeout_from_environment());
  const std::chrono::milliseconds before = comm.timeout();
  comm.set_timeout(std::chrono::milliseconds(1500));
  EXPECT_EQ(comm.timeout(), std::chrono::milliseconds(1500));
  EXPECT_CONTAINS(error_of([&] { comm.set_timeout(std::chrono::milliseconds(0)); }),
                  "0 ms is not a positive time");
  EXPECT_CONTAINS(error_of([&] { comm.set_timeout(std::chrono::seconds(-3)); }),
                  "-3000 ms is not a positive time");
  EXPECT_EQ(comm.timeout(), std::chrono::milliseconds(1500));
  comm.barrier();  // a collective with the new timeout
  comm.set_timeout(before);
}

inline void check_bad_arguments(Communicator& comm) {
  int x = 0;
  EXPECT_CONTAINS(error_of([&] { comm.send(&x, sizeof(x), comm.rank(), 0); }),
                  "is not another rank");
  EXPECT_CONTAINS(error_of([&] { comm.broadcast(&x, sizeof(x), comm.world_size()); }),
                  "is not a rank of a world of");
  float y = 0.0f;
  EXPECT_CONTAINS(error_of([&] { comm.reduce_sum(&y, &y, 1, -1); }), "is not a rank of a world of");
}

// Communicator::duplicate: the same ranks, the same timeout, and collectives that run on
// another thread at the same time as the original's (a CollectiveQueue beside the training
// thread) without their messages meeting: each side gets its own sums, to the bit, round
// after round. Lengths differ on the two sides, so a message taken by the wrong side shows.
inline void check_duplicate_runs_beside_the_original(Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  std::unique_ptr<Communicator> copy = comm.duplicate();
  ASSERT_NE(copy, nullptr) << "backend " << comm.backend() << " gave no duplicate";
  EXPECT_EQ(copy->rank(), rank);
  EXPECT_EQ(copy->world_size(), world);
  EXPECT_EQ(copy->timeout(), comm.timeout());
  constexpr int kRounds = 25;
  const size_t n_here = 1003, n_there = 2 * 1024 + 5;
  const std::vector<float> want_here = sum_in_tree_order(world, n_here);
  const std::vector<float> want_there = sum_in_tree_order(world, n_there);
  int wrong_there = 0, wrong_gathers = 0;
  std::exception_ptr failure;
  std::thread other([&] {
    try {
      for (int round = 0; round < kRounds; round++) {
        std::vector<float> x = rank_data(rank, n_there);
        copy->all_reduce_sum(x.data(), n_there);
        wrong_there += !same_bits(x, want_there);
        int from_root = rank == round % world ? round : -1;
        copy->broadcast(&from_root, sizeof(from_root), round % world);
        wrong_there += from_root != round;
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  int wrong_here = 0;
  for (int round = 0; round < kRounds; round++) {
    std::vector<float> x = rank_data(rank, n_here);
    comm.all_reduce_sum(x.data(), n_here);
    wrong_here += !same_bits(x, want_here);
    const int mine = 1000 * round + rank;
    std::vector<int> all(world);
    comm.all_gather(&mine, all.data(), sizeof(mine));
    for (int r = 0; r < world; r++) wrong_gathers += all[r] != 1000 * round + r;
  }
  other.join();
  if (failure) std::rethrow_exception(failure);
  EXPECT_EQ(wrong_here, 0) << "rank " << rank;
  EXPECT_EQ(wrong_gathers, 0) << "rank " << rank;
  EXPECT_EQ(wrong_there, 0) << "rank " << rank;
  // Each counts its own traffic.
  if (world > 1) {
    EXPECT_GT(copy->traffic().bytes_sent, uint64_t{0});
  }
}

}  // namespace tandem::testing
