// A rank that hangs does not hang the others forever (communicator.h): on real MPI ranks,
// the last rank stops itself with SIGSTOP, as a hung process would be, and the others,
// with a timeout of 2 s, must throw within [2 s, 2 s + slack) an error naming exactly that
// rank and the call, first in an all-reduce, then in a recv from it; their communicators
// then refuse further calls. A helper process wakes the stopped rank (SIGCONT) after 5 s, and
// all ranks meet in a barrier of a communicator that did not fail and exit cleanly.
//
// CTest runs this with `mpirun --allow-run-as-root --oversubscribe -np 3` (CMakeLists.txt,
// dist_mpi_faults_3_ranks); without a launcher it skips.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/mpi_communicator.h"

extern char** environ;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::seconds(2);
constexpr int kStoppedSeconds = 5;  // past both timeouts of the other ranks
// The wait may pass the timeout by this much: the last poll, scheduling on 2 busy cores.
constexpr double kSlackSeconds = 3.0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Stops this process (SIGSTOP: it takes no part in anything, MPI's progress included)
// until a helper process sends it SIGCONT after `seconds`. The helper ends on its own
// whatever happens to this process.
void stop_for(int seconds) {
  const std::string script =
      "sleep " + std::to_string(seconds) + "; kill -CONT " + std::to_string(::getpid());
  const char* argv[] = {"sh", "-c", script.c_str(), nullptr};
  pid_t helper = 0;
  ASSERT_EQ(posix_spawn(&helper, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
            0);
  ::raise(SIGSTOP);
  int status = 0;
  ::waitpid(helper, &status, 0);
}

TEST(MpiFaults, AStoppedRankIsNamedWithinTheTimeoutInACollectiveAndARecv) {
  if (!launched_by_mpi()) GTEST_SKIP() << "run this test with mpirun -np 3 (CTest does)";
  // All made before any rank stops: making a communicator is itself collective.
  const std::unique_ptr<Communicator> collective = make_mpi_communicator();
  const std::unique_ptr<Communicator> point_to_point = make_mpi_communicator();
  const std::unique_ptr<Communicator> after = make_mpi_communicator();
  const int world = collective->world_size(), rank = collective->rank();
  if (world < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const int stopped = world - 1;
  const std::string me = "rank " + std::to_string(rank) + ": ";
  const std::string hint = " (dead or hung?); raise TANDEM_COMM_TIMEOUT_S if a rank is only slow";
  collective->barrier();

  if (rank == stopped) {
    stop_for(kStoppedSeconds);
  } else {
    collective->set_timeout(kTimeout);
    point_to_point->set_timeout(kTimeout);
    const double timeout = std::chrono::duration<double>(kTimeout).count();

    std::vector<float> x(1001, 1.0f);
    Clock::time_point start = Clock::now();
    const std::string reduce =
        testing::error_of([&] { collective->all_reduce_sum(x.data(), 1001); });
    double waited = seconds_since(start);
    EXPECT_EQ(reduce, me + "no data from rank(s) " + std::to_string(stopped) +
                          " within 2 s in all_reduce_sum" + hint);
    EXPECT_GE(waited, timeout);
    EXPECT_LT(waited, timeout + kSlackSeconds);
    std::printf("[ rank %d ] all_reduce_sum gave up after %.3f s\n", rank, waited);

    // Which of its messages arrived is unknown: the communicator refuses more, at once.
    start = Clock::now();
    EXPECT_CONTAINS(testing::error_of([&] { collective->barrier(); }),
                    "cannot be used after an earlier failure");
    EXPECT_LT(seconds_since(start), 0.5);

    int message = 0;
    start = Clock::now();
    const std::string recv =
        testing::error_of([&] { point_to_point->recv(&message, sizeof(message), stopped, 3); });
    waited = seconds_since(start);
    EXPECT_EQ(recv, me + "no data from rank(s) " + std::to_string(stopped) +
                        " within 2 s in recv (tag 3)" + hint);
    EXPECT_GE(waited, timeout);
    EXPECT_LT(waited, timeout + kSlackSeconds);
    std::printf("[ rank %d ] recv gave up after %.3f s\n", rank, waited);
  }

  // The stopped rank is back: every rank meets in a communicator that did not fail, and
  // the job ends cleanly (MPI is finalized with the last communicator).
  after->set_timeout(std::chrono::seconds(30));
  after->barrier();
  float one = 1.0f;
  after->all_reduce_sum(&one, 1);
  EXPECT_EQ(one, static_cast<float>(world));
}

}  // namespace
}  // namespace tandem
