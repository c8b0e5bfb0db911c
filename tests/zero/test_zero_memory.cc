// The partitioned memory of ZeRO stages 2 and 3 on its own, on in-process ranks:
// PartitionedGradients reduces each released block to its owners and sums a step's
// micro-batches as the tree over micro-batches of the trees over ranks;
// PartitionedParameters gathers each block's exact values from their owners, keeps small
// blocks whole, stays within its live budget and prefetches in the recorded order.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "tandem/comm/collective_queue.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/tree_sum.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/error.h"
#include "tandem/zero/partitioned_gradients.h"
#include "tandem/zero/partitioned_parameters.h"

namespace tandem {
namespace {

// 86,300 parameters in five blocks, the largest two 40,000; at 3 ranks S = 32,768, so
// blocks straddle partitions and the last rank's partition is short.
std::vector<ParamRange> test_blocks() {
  std::vector<ParamRange> blocks;
  size_t begin = 0;
  for (size_t size : {5000, 40000, 40000, 300, 1000}) {
    blocks.push_back({begin, begin + size});
    begin += size;
  }
  return blocks;
}

size_t total(const std::vector<ParamRange>& blocks) { return blocks.back().end; }

// The gradient rank r computes for parameter i in micro-batch a: values whose sums round
// differently in another order.
float gradient(int rank, int micro, size_t i) {
  return 1.0f / static_cast<float>(3 + rank * 7 + micro * 13) + static_cast<float>(i % 97) * 1e-3f;
}

// The tree sum (comm/tree_sum.h) over `count` parts of n values, part k's value i being
// value(k, i).
template <typename Value>
std::vector<float> tree_of(int count, size_t n, Value value) {
  std::vector<std::vector<float>> parts(count, std::vector<float>(n));
  std::vector<const float*> pointers;
  for (int k = 0; k < count; k++) {
    for (size_t i = 0; i < n; i++) parts[k][i] = value(k, i);
    pointers.push_back(parts[k].data());
  }
  std::vector<float> sum(n);
  tree_sum(pointers.data(), count, n, sum.data());
  return sum;
}

TEST(PartitionedGradients, OwnersHoldTheTreeOverMicroBatchesOfTheTreesOverRanks) {
  const std::vector<ParamRange> blocks = test_blocks();
  const size_t P = total(blocks);
  const int world = 3, micro_batches = 3;
  const ZeroPartition partition(P, world);
  // Expected: for each micro-batch the tree over ranks, then the tree over micro-batches.
  std::vector<std::vector<float>> per_micro;
  for (int a = 0; a < micro_batches; a++)
    per_micro.push_back(tree_of(world, P, [&](int r, size_t i) { return gradient(r, a, i); }));
  const std::vector<float> expected =
      tree_of(micro_batches, P, [&](int a, size_t i) { return per_micro[a][i]; });

  for (bool overlap : {false, true}) {
    std::vector<std::vector<float>> got(world);
    run_local_ranks(world, [&](Communicator& comm) {
      const auto backend = make_cpu_backend();
      // overlap_comm: the reductions run on a queue's thread, over a duplicate communicator.
      const std::unique_ptr<Communicator> copy = overlap ? comm.duplicate() : nullptr;
      std::unique_ptr<CollectiveQueue> queue =
          overlap ? std::make_unique<CollectiveQueue>() : nullptr;
      PartitionedGradients grads(overlap ? *copy : comm, *backend, StorageDType::kF32, partition,
                                 blocks, micro_batches, 7000, queue.get());
      for (int a = 0; a < micro_batches; a++) {
        grads.start_micro_batch(a);
        // Backward's order: the first block held throughout, the others last to first.
        auto* first = static_cast<float*>(grads.acquire(0));
        for (int b = static_cast<int>(blocks.size()) - 1; b >= 1; b--) {
          auto* slot = static_cast<float*>(grads.acquire(b));
          for (size_t i = blocks[b].begin; i < blocks[b].end; i++)
            slot[i - blocks[b].begin] += gradient(comm.rank(), a, i);
          grads.release(b);
        }
        for (size_t i = 0; i < blocks[0].end; i++) first[i] += gradient(comm.rank(), a, i);
        grads.release(0);
        grads.finish_micro_batch();
      }
      const ParamRange mine = partition.range(comm.rank());
      const auto* reduced = static_cast<const float*>(grads.partition_grads());
      got[comm.rank()].assign(reduced, reduced + mine.size());
    });
    for (int r = 0; r < world; r++) {
      const ParamRange mine = partition.range(r);
      ASSERT_EQ(got[r].size(), mine.size());
      EXPECT_EQ(
          std::memcmp(got[r].data(), expected.data() + mine.begin, mine.size() * sizeof(float)), 0)
          << "rank " << r << (overlap ? ", overlap_comm" : "");
    }
  }
  // The order matters: the tree over ranks of the trees over micro-batches differs.
  std::vector<std::vector<float>> per_rank;
  for (int r = 0; r < world; r++)
    per_rank.push_back(
        tree_of(micro_batches, P, [&](int a, size_t i) { return gradient(r, a, i); }));
  const std::vector<float> other =
      tree_of(world, P, [&](int r, size_t i) { return per_rank[r][i]; });
  EXPECT_NE(std::memcmp(other.data(), expected.data(), P * sizeof(float)), 0);
}

// A communicator that holds some of its collectives back until the test lets them go, so a
// test can show that the training thread went on while they were pending. A held collective
// never let go fails after 20 s, naming what waited for it.
class HoldingCommunicator final : public Communicator {
 public:
  explicit HoldingCommunicator(Communicator& inner) : inner_(inner) {}

  // From now on reduce_sum calls, resp. broadcasts of `bytes` bytes, wait for let_go().
  // `from_call`: hold only the reduce_sum calls from that one on (0-based, counted since
  // construction), so that earlier ones still queued on a slow machine pass.
  void hold_reductions(int from_call = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    hold_from_call_ = from_call;
    hold_reductions_ = true;
  }
  void hold_broadcasts_of(size_t bytes) { set(false, bytes); }
  void let_go() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hold_reductions_ = false;
      hold_broadcast_bytes_ = kNoSize;
    }
    changed_.notify_all();
  }
  // Collectives that were held back so far.
  int held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string_view backend() const override { return inner_.backend(); }
  void all_reduce_sum(float* data, size_t n) override { inner_.all_reduce_sum(data, n); }
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    inner_.reduce_scatter_sum(send, recv, count);
  }
  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    int call = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      call = reduce_calls_++;
    }
    wait_if([&] { return hold_reductions_ && call >= hold_from_call_; }, "reduce_sum");
    inner_.reduce_sum(send, recv, n, root);
  }
  void all_reduce_sum_bf16(Bf16* data, size_t n) override { inner_.all_reduce_sum_bf16(data, n); }
  void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) override {
    inner_.reduce_sum_bf16(send, recv, n, root);
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    inner_.all_gather(send, recv, bytes);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    wait_if([&] { return hold_broadcast_bytes_ == bytes; }, "broadcast");
    inner_.broadcast(data, bytes, root);
  }
  void barrier() override { inner_.barrier(); }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    inner_.send(data, bytes, peer, tag);
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    inner_.recv(data, bytes, peer, tag);
  }
  void abort() noexcept override { inner_.abort(); }

 private:
  static constexpr size_t kAnySize = 0, kNoSize = static_cast<size_t>(-1);
  void set(bool reductions, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (reductions) hold_reductions_ = true;
    if (!reductions) hold_broadcast_bytes_ = bytes;
  }
  template <typename Held>
  void wait_if(Held held, const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!held()) return;
    held_++;
    if (!changed_.wait_for(lock, std::chrono::seconds(20), [&] { return !held(); }))
      fail("rank ", inner_.rank(), ": a held ", what,
           " was never let go: the training thread waited for it instead of going on");
  }

  Communicator& inner_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool hold_reductions_ = false;
  int reduce_calls_ = 0, hold_from_call_ = 0;
  size_t hold_broadcast_bytes_ = kNoSize;
  int held_ = 0;
};

// overlap_comm at stage 2: releasing a block starts its reduction and returns; backward
// goes on with the next block (in the third slot, while the embeddings hold the first)
// while the reduction is held back. A synchronous reduction would wait inside release(),
// and two slots would make acquire() wait (20 s, then fail).
TEST(PartitionedGradients, WithAQueueReleaseReturnsWhileTheReductionIsPending) {
  const std::vector<ParamRange> blocks = test_blocks();
  const size_t P = total(blocks);
  const int world = 2;
  const ZeroPartition partition(P, world);
  const std::vector<float> expected =
      tree_of(world, P, [&](int r, size_t i) { return gradient(r, 0, i); });
  std::vector<int> held(world);
  std::vector<std::vector<float>> got(world);
  run_local_ranks(world, [&](Communicator& comm) {
    const auto backend = make_cpu_backend();
    const std::unique_ptr<Communicator> copy = comm.duplicate();
    HoldingCommunicator holding(*copy);
    CollectiveQueue queue;
    PartitionedGradients grads(holding, *backend, StorageDType::kF32, partition, blocks, 1, 100000,
                               &queue);
    grads.start_micro_batch(0);
    auto* first = static_cast<float*>(grads.acquire(0));
    for (int b = static_cast<int>(blocks.size()) - 1; b >= 1; b--) {
      auto* slot = static_cast<float*>(grads.acquire(b));
      if (b == 1) {
        // Block 2's reduction is still held back, yet backward got a slot for block 1
        // (the third one) and goes on.
        EXPECT_TRUE(grads.reducing(blocks[2].begin, blocks[2].end));
        holding.let_go();
      }
      for (size_t i = blocks[b].begin; i < blocks[b].end; i++)
        slot[i - blocks[b].begin] += gradient(comm.rank(), 0, i);
      // Blocks 4 and 3 were one reduce_sum each; block 2's, the third, is held (theirs may
      // still be queued on a loaded machine, and must not be held with it: the slots
      // they free are the ones backward goes on with).
      if (b == 2) holding.hold_reductions(2);
      grads.release(b);
      if (b == 2) {
        EXPECT_TRUE(grads.reducing(blocks[2].begin, blocks[2].end));
      }
    }
    for (size_t i = 0; i < blocks[0].end; i++) first[i] += gradient(comm.rank(), 0, i);
    grads.release(0);
    grads.finish_micro_batch();
    EXPECT_FALSE(grads.reducing(0, P));
    held[comm.rank()] = holding.held();
    const ParamRange mine = partition.range(comm.rank());
    const auto* reduced = static_cast<const float*>(grads.partition_grads());
    got[comm.rank()].assign(reduced, reduced + mine.size());
  });
  for (int r = 0; r < world; r++) {
    const ParamRange mine = partition.range(r);
    EXPECT_EQ(std::memcmp(got[r].data(), expected.data() + mine.begin, mine.size() * sizeof(float)),
              0)
        << "rank " << r;
  }
  // The held reduction ran once let go, on the queue's thread (whether it reached the hold
  // before the let-go is up to the scheduler).
  for (int h : held) EXPECT_LE(h, 2);
}

TEST(PartitionedGradients, AThirdBlockHeldAtOnceIsRefused) {
  const std::vector<ParamRange> blocks = test_blocks();
  const auto backend = make_cpu_backend();
  run_local_ranks(1, [&](Communicator& comm) {
    PartitionedGradients grads(comm, *backend, StorageDType::kF32, ZeroPartition(total(blocks), 1),
                               blocks, 1, 1000);
    grads.start_micro_batch(0);
    grads.acquire(1);
    grads.acquire(2);
    EXPECT_THROW(grads.acquire(0), Error);
  });
}

// Each rank's partition holds value i at parameter i; a gathered block must too.
void fill_partition(PartitionedParameters& params, const ZeroPartition& partition, int rank) {
  const ParamRange mine = partition.range(rank);
  auto* p = static_cast<float*>(params.partition_params());
  for (size_t i = mine.begin; i < mine.end; i++) p[i - mine.begin] = static_cast<float>(i);
}

bool holds_its_values(const void* data, ParamRange block) {
  const auto* p = static_cast<const float*>(data);
  for (size_t i = block.begin; i < block.end; i++)
    if (p[i - block.begin] != static_cast<float>(i)) return false;
  return true;
}

TEST(PartitionedParameters, GathersExactBlocksWithinTheLiveBudget) {
  const std::vector<ParamRange> blocks = test_blocks();
  const int world = 3;
  const ZeroPartition partition(total(blocks), world);
  for (size_t prefetch : {size_t{0}, size_t{6000}, size_t{6001}}) {
    // 6001: the same prefetch, overlapping compute (a queue over a duplicate communicator).
    const bool overlap = prefetch == 6001;
    ZeroConfig config;
    config.stage = 3;
    config.stage3_param_persistence_threshold = 1000;  // blocks 3 and 4 stay whole
    config.stage3_max_live_parameters = 80000 + prefetch;
    config.stage3_prefetch_bucket_size = prefetch;
    EXPECT_EQ(PartitionedParameters::sizes(blocks, config).persistent, 1300u);
    EXPECT_EQ(PartitionedParameters::sizes(blocks, config).live, 80000u);  // two blocks
    std::vector<size_t> peaks(world), prefetched(world), gathered(world);
    run_local_ranks(world, [&](Communicator& comm) {
      const auto backend = make_cpu_backend();
      const std::unique_ptr<Communicator> copy = overlap ? comm.duplicate() : nullptr;
      std::unique_ptr<CollectiveQueue> queue =
          overlap ? std::make_unique<CollectiveQueue>() : nullptr;
      PartitionedParameters params(overlap ? *copy : comm, *backend, StorageDType::kF32, partition,
                                   blocks, config, queue.get());
      fill_partition(params, partition, comm.rank());
      params.parameters_changed();
      // Two passes of a forward-and-backward order: the first records it, the second
      // prefetches along it.
      const std::vector<int> order = {0, 1, 2, 3, 0, 4, 2, 1};
      for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < order.size(); k++) {
          const int b = order[k];
          const void* data = params.acquire(b);
          EXPECT_TRUE(holds_its_values(data, blocks[b]))
              << "rank " << comm.rank() << ", pass " << pass << ", block " << b;
          // The two layers in use at once: the next one acquired before this one's release.
          if (b == 1 && k + 1 < order.size()) {
            const int next = order[k + 1];
            EXPECT_TRUE(holds_its_values(params.acquire(next), blocks[next]));
            params.release(next);
          }
          params.release(b);
        }
        params.parameters_changed();
      }
      peaks[comm.rank()] = params.peak_live_elements();
      prefetched[comm.rank()] = params.prefetched_blocks();
      gathered[comm.rank()] = params.gathered_blocks();
    });
    // Only block 0 (5,000) fits the prefetch bucket: in the second pass it is fetched with
    // the block before it. Every rank makes the same gathers.
    for (int r = 0; r < world; r++) {
      if (prefetch > 0)
        EXPECT_GE(prefetched[r], 1u) << "rank " << r;
      else
        EXPECT_EQ(prefetched[r], 0u) << "rank " << r;
      EXPECT_EQ(gathered[r], gathered[0]) << "rank " << r;
    }
    for (size_t peak : peaks) {
      EXPECT_LE(peak, 80000u);
      EXPECT_GE(peak, 80000u);  // the two layers were held together
    }
  }
}

// overlap_comm at stage 3: once the order of acquires is known, acquiring a block queues
// the gather of the next one and returns without waiting for it: the model computes with
// this block while the next arrives. Here block 0 (5,000 parameters, one broadcast of 20,000
// bytes from rank 0) is prefetched when block 2 is acquired, and held back until block 2 has
// been used; a synchronous gather would keep acquire(2) waiting (20 s, then fail).
TEST(PartitionedParameters, WithAQueueTheNextBlockArrivesWhileTheModelUsesThisOne) {
  const std::vector<ParamRange> blocks = test_blocks();
  const int world = 3;
  const ZeroPartition partition(total(blocks), world);
  ZeroConfig config;
  config.stage = 3;
  config.stage3_param_persistence_threshold = 1000;
  config.stage3_max_live_parameters = 80000;
  config.stage3_prefetch_bucket_size = 6000;
  std::vector<size_t> prefetched(world);
  run_local_ranks(world, [&](Communicator& comm) {
    const auto backend = make_cpu_backend();
    const std::unique_ptr<Communicator> copy = comm.duplicate();
    HoldingCommunicator holding(*copy);
    CollectiveQueue queue;
    PartitionedParameters params(holding, *backend, StorageDType::kF32, partition, blocks, config,
                                 &queue);
    fill_partition(params, partition, comm.rank());
    params.parameters_changed();
    const std::vector<int> order = {1, 2, 3, 0};
    for (int pass = 0; pass < 2; pass++) {  // the first records the order
      for (int b : order) {
        const bool watched = pass == 1 && b == 2;
        if (watched) holding.hold_broadcasts_of(5000 * sizeof(float));
        const size_t before = params.prefetched_blocks();
        const void* data = params.acquire(b);
        EXPECT_TRUE(holds_its_values(data, blocks[b])) << "rank " << comm.rank() << ", block " << b;
        if (watched) {
          EXPECT_EQ(params.prefetched_blocks(), before + 1) << "block 0 was not prefetched";
          holding.let_go();
        }
        params.release(b);
      }
      params.parameters_changed();
    }
    prefetched[comm.rank()] = params.prefetched_blocks();
  });
  for (size_t p : prefetched) EXPECT_EQ(p, 1u);
}

TEST(PartitionedParameters, ALiveBudgetBelowTheTwoLargestBlocksIsRefused) {
  ZeroConfig config;
  config.stage3_param_persistence_threshold = 1000;
  config.stage3_max_live_parameters = 79999;
  try {
    PartitionedParameters::sizes(test_blocks(), config);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise it to at least 80000"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem
