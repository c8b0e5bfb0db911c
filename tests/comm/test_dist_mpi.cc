// The communicator contract (tests/support/communicator_contract.h) on real MPI ranks. CTest runs
// this with `mpirun --allow-run-as-root --oversubscribe -np N` for several N (see
// CMakeLists.txt); every rank runs every test, and mpirun fails if any rank does. A rank
// that stops taking part: test_dist_mpi_faults.cc.
#include <gtest/gtest.h>

#include <memory>

#include "support/communicator_contract.h"
#include "tandem/comm/mpi_communicator.h"

namespace tandem {
namespace {

class MpiCommunicator : public ::testing::Test {
 protected:
  // One communicator for all the tests: MPI is initialized once and finalized at the end.
  static void SetUpTestSuite() { comm_ = make_mpi_communicator(); }
  static void TearDownTestSuite() { comm_.reset(); }
  static std::unique_ptr<Communicator> comm_;
};
std::unique_ptr<Communicator> MpiCommunicator::comm_;

TEST_F(MpiCommunicator, IsTheLaunchersWorld) {
  ASSERT_TRUE(launched_by_mpi()) << "run this test with mpirun";
  EXPECT_EQ(comm_->backend(), "mpi");
  EXPECT_GE(comm_->world_size(), 1);
}
TEST_F(MpiCommunicator, AllReduceSumsInTreeOrder) { testing::check_all_reduce(*comm_); }
TEST_F(MpiCommunicator, AllReduceOfFewerValuesThanRanks) {
  testing::check_all_reduce_short(*comm_);
}
TEST_F(MpiCommunicator, ReduceScatterGivesEachRankItsSlice) {
  testing::check_reduce_scatter(*comm_);
}
TEST_F(MpiCommunicator, ReduceSumGivesEveryRootTheTreeSum) { testing::check_reduce_sum(*comm_); }
TEST_F(MpiCommunicator, Bf16SumsRoundEveryAdditionOfTheTree) { testing::check_bf16_sums(*comm_); }
TEST_F(MpiCommunicator, AllGatherAndBroadcastFromEveryRoot) {
  testing::check_gather_and_broadcast(*comm_);
}
TEST_F(MpiCommunicator, PointToPointArrivesInOrder) { testing::check_point_to_point(*comm_); }
TEST_F(MpiCommunicator, BadPeersAndRootsAreRefused) { testing::check_bad_arguments(*comm_); }
TEST_F(MpiCommunicator, TimeoutIsSetPerCommunicator) { testing::check_timeout_setting(*comm_); }
// Needs MPI_THREAD_MULTIPLE, which Debian's OpenMPI provides (tandem asks for it).
TEST_F(MpiCommunicator, DuplicateRunsBesideTheOriginal) {
  testing::check_duplicate_runs_beside_the_original(*comm_);
}

}  // namespace
}  // namespace tandem
