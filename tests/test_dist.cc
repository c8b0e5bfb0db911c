// The communicator contract (tests/communicator_contract.h) on the in-process backend, for
// world sizes 1 to 5 and lengths that do not divide by them, and a failing rank that does
// not hang the others.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "communicator_contract.h"
#include "tandem/dist/local_group.h"
#include "tandem/dist/mpi_communicator.h"

namespace tandem {
namespace {

class LocalCommunicator : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommunicator, AllReduceSumsInRankOrder) {
  run_local_ranks(GetParam(), testing::check_all_reduce);
}
TEST_P(LocalCommunicator, ReduceScatterGivesEachRankItsSlice) {
  run_local_ranks(GetParam(), testing::check_reduce_scatter);
}
TEST_P(LocalCommunicator, AllGatherAndBroadcastFromEveryRoot) {
  run_local_ranks(GetParam(), testing::check_gather_and_broadcast);
}
TEST_P(LocalCommunicator, PointToPointArrivesInOrder) {
  run_local_ranks(GetParam(), testing::check_point_to_point);
}
TEST_P(LocalCommunicator, BadPeersAndRootsAreRefused) {
  run_local_ranks(GetParam(), testing::check_bad_arguments);
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

// Without a launcher a process is a world of one, whether or not tandem has MPI.
TEST(WorldCommunicator, WithoutALauncherIsOneRank) {
  if (launched_by_mpi()) GTEST_SKIP() << "started by an MPI launcher";
  const auto comm = make_world_communicator();
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  testing::check_all_reduce(*comm);
}

}  // namespace
}  // namespace tandem
