// The summation tree (comm/tree_sum.h) against hand-written expressions and the streaming
// stack form; the communicator contract (tests/support/communicator_contract.h) on the in-process
// backend, for world sizes 1 to 5 and lengths that do not divide by them; a failing rank
// that does not hang the others, and one that stops taking part named after the timeout
// (TANDEM_COMM_TIMEOUT_S, set_timeout); and the same bits from N ranks of A micro-batches for
// every split of N * A.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/communicator_contract.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/mpi_communicator.h"
#include "tandem/comm/tree_sum.h"

namespace tandem {
namespace {

// parts[k][i] for count parts of n elements, from values whose sums depend on the order.
std::vector<std::vector<float>> order_sensitive_parts(int count, size_t n, uint64_t seed) {
  static const float kNasty[] = {1e8f, 1.0f, -1e8f, 3.3f, 7e7f, -2.5f, 0.7f, -7e7f, 1e-3f, 5e7f};
  Rng rng(seed);
  std::vector<std::vector<float>> parts(count, std::vector<float>(n));
  for (auto& part : parts) {
    for (float& v : part) {
      const float nasty = kNasty[rng.next_u64() % std::size(kNasty)];
      v = nasty * (1.0f + 0.1f * rng.normal());
    }
  }
  return parts;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& parts) {
  std::vector<const float*> p;
  for (const auto& part : parts) p.push_back(part.data());
  return p;
}

std::vector<float> tree_sum_of(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out(parts[0].size(), -1.0f);
  tree_sum(pointers(parts).data(), static_cast<int>(parts.size()), out.size(), out.data());
  return out;
}

// The expressions of tree_sum.h, written out.
float by_hand(const std::vector<float>& x) {
  switch (x.size()) {
    case 1:
      return x[0];
    case 2:
      return x[0] + x[1];
    case 3:
      return (x[0] + x[1]) + x[2];
    case 4:
      return (x[0] + x[1]) + (x[2] + x[3]);
    case 5:
      return ((x[0] + x[1]) + (x[2] + x[3])) + x[4];
    case 6:
      return ((x[0] + x[1]) + (x[2] + x[3])) + (x[4] + x[5]);
    case 7:
      return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + x[6]);
    case 8:
      return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
  }
  ADD_FAILURE() << "no expression for " << x.size() << " values";
  return NAN;
}

float in_rank_order(const std::vector<float>& x) {
  float sum = x[0];
  for (size_t k = 1; k < x.size(); k++) sum += x[k];
  return sum;
}

// The streaming form: a stack of partial sums with their levels, merged as a binary counter
// carries; at the end the last one pushed is added to the rest from the top down.
float by_stack(const std::vector<float>& x) {
  struct Partial {
    float value;
    int level;
  };
  std::vector<Partial> stack;
  for (float leaf : x) {
    Partial node{leaf, 0};
    while (!stack.empty() && stack.back().level == node.level) {
      node = Partial{stack.back().value + node.value, node.level + 1};
      stack.pop_back();
    }
    stack.push_back(node);
  }
  float current = stack.back().value;
  for (int i = static_cast<int>(stack.size()) - 2; i >= 0; i--) current = stack[i].value + current;
  return current;
}

std::vector<float> column(const std::vector<std::vector<float>>& parts, size_t i) {
  std::vector<float> x;
  for (const auto& part : parts) x.push_back(part[i]);
  return x;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Over 1100 elements: more than two of tree_sum's 512-element passes, the last one short.
TEST(TreeSum, MatchesTheHandWrittenExpressionsUpToEightParts) {
  const size_t n = 1100;
  for (int count = 1; count <= 8; count++) {
    const auto parts = order_sensitive_parts(count, n, 10 + count);
    const std::vector<float> sum = tree_sum_of(parts);
    size_t differs_from_rank_order = 0;
    for (size_t i = 0; i < n; i++) {
      const std::vector<float> x = column(parts, i);
      ASSERT_TRUE(same_bits(sum[i], by_hand(x)))
          << count << " parts, element " << i << ": " << sum[i] << " vs " << by_hand(x);
      ASSERT_TRUE(same_bits(tree_sum_scalar(x.data(), count), sum[i]));
      differs_from_rank_order += !same_bits(sum[i], in_rank_order(x));
    }
    // The data tells the orders apart wherever they are different expressions.
    if (count >= 4) {
      EXPECT_GT(differs_from_rank_order, 0u) << count << " parts";
    }
  }
}

TEST(TreeSum, EqualsTheStreamingStackAccumulationForEveryCountUpTo40) {
  const size_t n = 1100;
  for (int count = 1; count <= 40; count++) {
    const auto parts = order_sensitive_parts(count, n, 100 + count);
    const std::vector<float> sum = tree_sum_of(parts);
    for (size_t i = 0; i < n; i++) {
      const float streamed = by_stack(column(parts, i));
      ASSERT_TRUE(same_bits(sum[i], streamed))
          << count << " parts, element " << i << ": " << sum[i] << " vs " << streamed;
    }
  }
}

TEST(TreeSum, OutMayBeAPartItself) {
  const size_t n = 1100;
  for (int count : {1, 2, 3, 5, 8}) {
    const auto parts = order_sensitive_parts(count, n, 7 + count);
    const std::vector<float> want = tree_sum_of(parts);
    for (int k : {0, count - 1}) {
      auto copy = parts;
      std::vector<const float*> p = pointers(copy);
      tree_sum(p.data(), count, n, copy[k].data());
      EXPECT_TRUE(testing::same_bits(copy[k], want)) << count << " parts, out = part " << k;
    }
  }
}

TEST(TreeSum, RefusesZeroParts) {
  float x = 1.0f;
  EXPECT_CONTAINS(testing::error_of([&] { tree_sum(nullptr, 0, 1, &x); }), "at least one part");
  EXPECT_CONTAINS(testing::error_of([&] { tree_sum_scalar(&x, 0); }), "at least one value");
  // No elements: nothing is read or written.
  const float* parts[2] = {nullptr, nullptr};
  tree_sum(parts, 2, 0, nullptr);
}

// The contract checks' data tells the tree from rank order from 4 ranks on (below 4 the two
// are the same expression), so those checks would catch a backend summing in rank order.
TEST(TreeSum, TheContractDataTellsTheTreeFromRankOrder) {
  const size_t n = 1001;
  for (int world : {4, 5}) {
    const std::vector<float> tree = testing::sum_in_tree_order(world, n);
    std::vector<std::vector<float>> data;
    for (int r = 0; r < world; r++) data.push_back(testing::rank_data(r, n));
    size_t differs = 0;
    for (size_t i = 0; i < n; i++) differs += !same_bits(tree[i], in_rank_order(column(data, i)));
    EXPECT_GT(differs, 0u) << world << " ranks";
  }
}

// N ranks that each tree-sum their A micro-batches and then all-reduce give the bits of
// the tree over all N * A micro-batches, whatever the split (A a power of two): a run can
// resume on another world size bit for bit.
TEST(TreeSum, NRanksOfAMicroBatchesGiveTheSameBitsForEverySplit) {
  const int total = 24;
  const size_t n = 300;
  const auto micro_batches = order_sensitive_parts(total, n, 2024);
  const std::vector<float> want = tree_sum_of(micro_batches);
  for (int per_rank : {1, 2, 4, 8}) {
    const int world = total / per_rank;
    std::vector<std::vector<float>> results(world);
    run_local_ranks(world, [&](Communicator& comm) {
      const std::vector<std::vector<float>> mine(
          micro_batches.begin() + comm.rank() * per_rank,
          micro_batches.begin() + (comm.rank() + 1) * per_rank);
      std::vector<float> sum = tree_sum_of(mine);
      comm.all_reduce_sum(sum.data(), n);
      results[comm.rank()] = sum;
    });
    for (int r = 0; r < world; r++) {
      EXPECT_TRUE(testing::same_bits(results[r], want))
          << world << " ranks of " << per_rank << ", rank " << r;
    }
  }
}

class LocalCommunicator : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommunicator, AllReduceSumsInTreeOrder) {
  run_local_ranks(GetParam(), testing::check_all_reduce);
}
TEST_P(LocalCommunicator, AllReduceOfFewerValuesThanRanks) {
  run_local_ranks(GetParam(), testing::check_all_reduce_short);
}
TEST_P(LocalCommunicator, ReduceScatterGivesEachRankItsSlice) {
  run_local_ranks(GetParam(), testing::check_reduce_scatter);
}
TEST_P(LocalCommunicator, Bf16SumsRoundEveryAdditionOfTheTree) {
  run_local_ranks(GetParam(), testing::check_bf16_sums);
}
TEST_P(LocalCommunicator, ReduceSumGivesEveryRootTheTreeSum) {
  run_local_ranks(GetParam(), testing::check_reduce_sum);
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
TEST_P(LocalCommunicator, TimeoutIsSetPerCommunicator) {
  run_local_ranks(GetParam(), testing::check_timeout_setting);
}
TEST_P(LocalCommunicator, DuplicateRunsBesideTheOriginal) {
  run_local_ranks(GetParam(), testing::check_duplicate_runs_beside_the_original);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LocalCommunicator, ::testing::Values(1, 2, 3, 4, 5));

// Every rank's k-th duplicate is one group, apart from its (k+1)-th: two duplicates made in
// turn run their collectives in either order on two threads.
TEST(LocalCommunicatorDuplicate, TheKthDuplicatesOfAllRanksAreOneGroup) {
  run_local_ranks(3, [](Communicator& comm) {
    std::unique_ptr<Communicator> first = comm.duplicate(), second = comm.duplicate();
    float a = static_cast<float>(comm.rank() + 1), b = static_cast<float>(10 * (comm.rank() + 1));
    std::thread other([&] { second->all_reduce_sum(&b, 1); });
    first->all_reduce_sum(&a, 1);
    other.join();
    EXPECT_EQ(a, 6.0f);
    EXPECT_EQ(b, 60.0f);
  });
}

// A rank that fails aborts its group: a collective another rank's queue thread has in flight
// on a duplicate ends at once too (instead of after the timeout), as MPI_Abort would end it.
TEST(LocalCommunicatorFailure, AbortingTheGroupEndsCollectivesOnItsDuplicates) {
  std::string blocked_error;
  const auto start = std::chrono::steady_clock::now();
  const std::string message = testing::error_of([&] {
    run_local_ranks(2, [&](Communicator& comm) {
      if (comm.rank() == 1) {
        comm.duplicate();
        // Most often rank 0 is in its barrier by now; under load it may still be duplicating,
        // and that call must end the same way (a CI run under load met it there).
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        fail("rank 1 fails on purpose");
      }
      try {
        std::unique_ptr<Communicator> copy = comm.duplicate();
        copy->set_timeout(std::chrono::seconds(60));
        copy->barrier();  // rank 1 never comes
      } catch (const Error& e) {
        blocked_error = e.what();
        throw;
      }
    });
  });
  EXPECT_CONTAINS(message, "rank 1 fails on purpose");
  EXPECT_CONTAINS(blocked_error, "another rank failed");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

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

// Sets an environment variable for one scope, and restores what was there.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CommunicatorTimeout, ParsesPositiveSeconds) {
  using std::chrono::milliseconds;
  EXPECT_EQ(parse_communicator_timeout("30"), milliseconds(30000));
  EXPECT_EQ(parse_communicator_timeout("600"), milliseconds(600000));
  EXPECT_EQ(parse_communicator_timeout("0.25"), milliseconds(250));
  EXPECT_EQ(parse_communicator_timeout("1e3"), milliseconds(1000000));
  EXPECT_EQ(parse_communicator_timeout("0.0001"), milliseconds(1));  // at least 1 ms
}

TEST(CommunicatorTimeout, RefusesMalformedAndNonPositiveValuesNamingTheVariable) {
  for (const char* bad : {"", "abc", "30s", "10 ", " 10", "1,5", "nan", "inf", "0x"}) {
    const std::string message = testing::error_of([&] { parse_communicator_timeout(bad); });
    EXPECT_CONTAINS(message, std::string("TANDEM_COMM_TIMEOUT_S='") + bad + "'");
    EXPECT_CONTAINS(message, "is not a number of seconds");
  }
  for (const char* non_positive : {"0", "-1", "-0.5", "0.0"}) {
    const std::string message =
        testing::error_of([&] { parse_communicator_timeout(non_positive); });
    EXPECT_CONTAINS(message, std::string("TANDEM_COMM_TIMEOUT_S='") + non_positive + "'");
    EXPECT_CONTAINS(message, "the timeout must be positive");
  }
  EXPECT_CONTAINS(testing::error_of([&] { parse_communicator_timeout("1e12"); }),
                  "more seconds than tandem takes");
}

TEST(CommunicatorTimeout, ComesFromTheEnvironmentElseTenMinutes) {
  {
    ScopedEnvironment unset("TANDEM_COMM_TIMEOUT_S", nullptr);
    EXPECT_EQ(communicator_timeout_from_environment(), std::chrono::seconds(600));
    LocalGroup group(1);
    EXPECT_EQ(group.communicator(0)->timeout(), std::chrono::seconds(600));
  }
  {
    ScopedEnvironment set("TANDEM_COMM_TIMEOUT_S", "12.5");
    EXPECT_EQ(communicator_timeout_from_environment(), std::chrono::milliseconds(12500));
    LocalGroup group(2);
    EXPECT_EQ(group.communicator(1)->timeout(), std::chrono::milliseconds(12500));
    // The world communicator of a process without a launcher too.
    if (!launched_by_mpi()) {
      EXPECT_EQ(make_world_communicator()->timeout(), std::chrono::milliseconds(12500));
    }
  }
  {
    // A malformed value fails where a communicator is made, naming the variable.
    ScopedEnvironment malformed("TANDEM_COMM_TIMEOUT_S", "ten");
    LocalGroup group(1);
    EXPECT_CONTAINS(testing::error_of([&] { group.communicator(0); }),
                    "TANDEM_COMM_TIMEOUT_S='ten' is not a number of seconds");
  }
}

// A rank that stops taking part: the others throw after their timeout, naming it and the
// collective, and do not wait for it any longer. When it comes back late, it is the one
// left waiting, and names them. (Plain threads: run_local_ranks would abort the group at
// the first error, and the others would see that instead of their own timeout.)
TEST(LocalCommunicatorFailure, ARankThatStopsIsNamedAfterTheTimeout) {
  using Clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::milliseconds(300);
  LocalGroup group(3);
  std::vector<std::string> errors(3);
  std::vector<double> waited(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; r++) {
    threads.emplace_back([&, r, comm = group.communicator(r)] {
      comm->set_timeout(timeout);
      if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(900));
      std::vector<float> x(8, 1.0f);
      const Clock::time_point start = Clock::now();
      errors[r] = testing::error_of([&] { comm->all_reduce_sum(x.data(), x.size()); });
      waited[r] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; r++) {
    EXPECT_EQ(errors[r], "rank " + std::to_string(r) +
                             ": no data from rank(s) 2 within 0.3 s in all_reduce_sum (dead or "
                             "hung?); raise TANDEM_COMM_TIMEOUT_S if a rank is only slow");
    EXPECT_GE(waited[r], 0.3);
    EXPECT_LT(waited[r], 0.3 + 3.0);
  }
  EXPECT_CONTAINS(errors[2], "rank 2: no data from rank(s) 0, 1 within 0.3 s in all_reduce_sum");
  EXPECT_GE(waited[2], 0.3);
}

TEST(LocalCommunicatorFailure, RecvNamesThePeerThatSendsNothing) {
  LocalGroup group(2);
  const auto comm = group.communicator(0);
  comm->set_timeout(std::chrono::milliseconds(100));
  int x = 0;
  EXPECT_EQ(testing::error_of([&] { comm->recv(&x, sizeof(x), 1, 5); }),
            "rank 0: no data from rank(s) 1 within 0.1 s in recv (tag 5) (dead or hung?); raise "
            "TANDEM_COMM_TIMEOUT_S if a rank is only slow");
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
