// The ranks' rate (comm/comm_rate.h): every rank gets rank 0's figure, and one rank has
// nothing to measure.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/comm_rate.h"
#include "tandem/comm/local_group.h"

namespace tandem {
namespace {

TEST(CommRateTest, EveryRankGetsRankZerosMeasuredRate) {
  std::mutex mutex;
  std::vector<CommRate> rates(3);
  run_local_ranks(3, [&](Communicator& comm) {
    const CommRate rate = measure_comm_rate(comm, size_t{1} << 16);
    const std::lock_guard lock(mutex);
    rates[comm.rank()] = rate;
  });
  EXPECT_GT(rates[0].bytes_per_s, 0);
  for (const CommRate& rate : rates) {
    EXPECT_EQ(rate.bytes_per_s, rates[0].bytes_per_s);
    EXPECT_CONTAINS(rate.source, "measured: local all-reduce");
    EXPECT_CONTAINS(rate.source, "over 3 ranks");
  }
}

TEST(CommRateTest, OneRankMovesNothing) {
  run_local_ranks(1, [](Communicator& comm) { EXPECT_EQ(measure_comm_rate(comm).bytes_per_s, 0); });
}

}  // namespace
}  // namespace tandem
