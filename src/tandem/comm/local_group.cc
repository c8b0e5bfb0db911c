#include "tandem/comm/local_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "tandem/comm/tree_sum.h"
#include "tandem/core/error.h"

namespace tandem {

struct LocalFamily;

struct LocalGroup::Shared {
  explicit Shared(int world)
      : world_size(world), published(world, nullptr), state(world, kAbsent) {}

  // All ranks arrive before any leaves; throws once the group is aborted, or after
  // `timeout` naming the ranks that did not arrive (this rank's arrival is taken back).
  void arrive_and_wait(int rank, std::chrono::milliseconds timeout, std::string_view what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mutex);
    check_alive();
    const uint64_t generation_now = generation;
    if (++arrived == world_size) {
      arrived = 0;
      std::fill(state.begin(), state.end(), kAbsent);
      generation++;
      changed.notify_all();
      return;
    }
    state[rank] = kWaiting;
    const auto done = [&] { return generation != generation_now || aborted; };
    if (!changed.wait_until(lock, deadline, done)) {
      arrived--;
      state[rank] = kGaveUp;
      // The ranks that never came; if all that are missing came and gave up, those.
      std::vector<int> missing;
      for (char wanted : {kAbsent, kGaveUp}) {
        for (int r = 0; r < world_size; r++)
          if (r != rank && state[r] == wanted) missing.push_back(r);
        if (!missing.empty()) break;
      }
      fail_communicator_timeout(rank, missing, true, timeout, what);
    }
    check_alive();
  }
  // Aborts this group and every duplicate of its family.
  void abort();
  void abort_this_group() {
    std::lock_guard<std::mutex> lock(mutex);
    aborted = true;
    changed.notify_all();
  }
  void check_alive() const {
    if (aborted) fail("local communicator: another rank failed; this collective cannot finish");
  }

  const int world_size;
  std::vector<const void*> published;  // each rank's buffer in the current collective
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  // Each rank at the barrier now: absent, waiting, or gone after its timeout.
  static constexpr char kAbsent = 0, kWaiting = 1, kGaveUp = 2;
  std::vector<char> state;
  uint64_t generation = 0;
  bool aborted = false;
  // Point-to-point messages in flight, by (source, destination, tag), in send order.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mailboxes;
  // The group it was made with and its duplicates (Communicator::duplicate).
  std::shared_ptr<LocalFamily> family;
};

// A local group and its duplicates: aborting one aborts all (as MPI_Abort ends every
// communicator of a job), and the k-th duplicate call of every rank gets the same group.
struct LocalFamily : std::enable_shared_from_this<LocalFamily> {
  std::mutex mutex;
  bool aborted = false;
  std::vector<std::weak_ptr<LocalGroup::Shared>> members;
  struct Made {
    std::shared_ptr<LocalGroup::Shared> group;  // held until every rank has taken it
    int takers = 0;
  };
  std::vector<Made> duplicates;
  std::vector<size_t> taken_by_rank;  // duplicates each rank has made

  static std::shared_ptr<LocalGroup::Shared> make_group(int world_size) {
    auto group = std::make_shared<LocalGroup::Shared>(world_size);
    group->family = std::make_shared<LocalFamily>();
    group->family->members.push_back(group);
    group->family->taken_by_rank.assign(world_size, 0);
    return group;
  }

  std::shared_ptr<LocalGroup::Shared> duplicate(int rank, int world_size) {
    std::lock_guard<std::mutex> lock(mutex);
    const size_t k = taken_by_rank[rank]++;
    if (k == duplicates.size()) {
      auto group = std::make_shared<LocalGroup::Shared>(world_size);
      group->family = shared_from_this();
      duplicates.push_back({group, 0});
      members.push_back(group);
      if (aborted) group->abort_this_group();
    }
    Made& made = duplicates[k];
    std::shared_ptr<LocalGroup::Shared> group = made.group;
    if (++made.takers == world_size) made.group.reset();
    return group;
  }

  void abort() {
    std::vector<std::shared_ptr<LocalGroup::Shared>> alive;
    {
      std::lock_guard<std::mutex> lock(mutex);
      aborted = true;
      for (const auto& member : members)
        if (auto group = member.lock()) alive.push_back(std::move(group));
    }
    for (const auto& group : alive) group->abort_this_group();
  }
};

void LocalGroup::Shared::abort() {
  if (family) {
    family->abort();
  } else {
    abort_this_group();
  }
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup::Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return shared_->world_size; }
  std::string_view backend() const override { return "local"; }

  void all_reduce_sum(float* data, size_t n) override { all_reduce(data, n, "all_reduce_sum"); }
  void all_reduce_sum_bf16(Bf16* data, size_t n) override {
    all_reduce(data, n, "all_reduce_sum_bf16");
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    std::vector<float> sum(count);
    exchange(
        send,
        [&](const std::vector<const void*>& all) {
          sum_over_ranks(all, static_cast<size_t>(rank_) * count, count, sum.data());
        },
        "reduce_scatter_sum");
    std::memcpy(recv, sum.data(), count * sizeof(float));
    count_traffic((world_size() - 1) * count * sizeof(float));
  }

  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    reduce(send, recv, n, root, "reduce_sum");
  }
  void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) override {
    reduce(send, recv, n, root, "reduce_sum_bf16");
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    std::vector<char> gathered(world_size() * bytes);
    exchange(
        send,
        [&](const std::vector<const void*>& all) {
          for (int r = 0; r < world_size(); r++)
            std::memcpy(gathered.data() + r * bytes, all[r], bytes);
        },
        "all_gather");
    std::memcpy(recv, gathered.data(), gathered.size());
    count_traffic((world_size() - 1) * bytes);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    TANDEM_CHECK(root >= 0 && root < world_size(), "broadcast: root ", root,
                 " is not a rank of a world of ", world_size());
    std::vector<char> copy(bytes);
    exchange(
        data,
        [&](const std::vector<const void*>& all) { std::memcpy(copy.data(), all[root], bytes); },
        "broadcast");
    if (rank_ != root) {
      std::memcpy(data, copy.data(), bytes);
      traffic_.bytes_received += bytes;
    } else if (world_size() > 1) {
      traffic_.bytes_sent += bytes;
    }
  }

  void barrier() override { shared_->arrive_and_wait(rank_, timeout_, "barrier"); }

  void abort() noexcept override { shared_->abort(); }

  std::unique_ptr<Communicator> duplicate() override {
    shared_->check_alive();
    auto copy =
        std::make_unique<LocalCommunicator>(shared_->family->duplicate(rank_, world_size()), rank_);
    copy->set_timeout(timeout_);
    return copy;
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    const auto* first = static_cast<const char*>(data);
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->check_alive();
      shared_->mailboxes[{rank_, peer, tag}].emplace_back(first, first + bytes);
    }
    shared_->changed.notify_all();
    traffic_.bytes_sent += bytes;
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    std::unique_lock<std::mutex> lock(shared_->mutex);
    auto& box = shared_->mailboxes[{peer, rank_, tag}];
    if (!shared_->changed.wait_for(lock, timeout_,
                                   [&] { return !box.empty() || shared_->aborted; })) {
      fail_communicator_timeout(rank_, {peer}, true, timeout_, cat("recv (tag ", tag, ")"));
    }
    shared_->check_alive();
    std::vector<char> message = std::move(box.front());
    box.pop_front();
    lock.unlock();
    TANDEM_CHECK(message.size() == bytes, "recv from rank ", peer, " (tag ", tag, "): expected ",
                 bytes, " bytes, the matching send had ", message.size());
    std::memcpy(data, message.data(), bytes);
    traffic_.bytes_received += bytes;
  }

 private:
  template <typename T>
  void all_reduce(T* data, size_t n, std::string_view what) {
    std::vector<T> sum(n);
    exchange(
        data, [&](const std::vector<const void*>& all) { sum_over_ranks(all, 0, n, sum.data()); },
        what);
    std::memcpy(data, sum.data(), n * sizeof(T));
    // A ring all-reduce moves 2 (N - 1) / N of the data each way.
    count_traffic(2 * (world_size() - 1) * n * sizeof(T) / world_size());
  }

  template <typename T>
  void reduce(const T* send, T* recv, size_t n, int root, std::string_view what) {
    TANDEM_CHECK(root >= 0 && root < world_size(), what, ": root ", root,
                 " is not a rank of a world of ", world_size());
    // Summed aside and copied after the exchange: in place, recv is the send buffer that
    // the other ranks are still reading.
    std::vector<T> sum(rank_ == root ? n : 0);
    exchange(
        send,
        [&](const std::vector<const void*>& all) {
          if (rank_ == root) sum_over_ranks(all, 0, n, sum.data());
        },
        what);
    if (rank_ == root) std::memcpy(recv, sum.data(), n * sizeof(T));
    // A ring reduce moves (N - 1) / N of the data each way.
    count_traffic((world_size() - 1) * n * sizeof(T) / world_size());
  }

  // Publishes this rank's buffer, lets `read` see every rank's once all have published, and
  // returns once every rank has finished reading (so buffers may change again).
  template <typename Read>
  void exchange(const void* mine, Read&& read, std::string_view what) {
    shared_->published[rank_] = mine;
    shared_->arrive_and_wait(rank_, timeout_, what);
    read(shared_->published);
    shared_->arrive_and_wait(rank_, timeout_, what);
  }

  // out[i] = tree sum over ranks of element offset + i of each rank's buffer.
  template <typename T>
  void sum_over_ranks(const std::vector<const void*>& all, size_t offset, size_t n, T* out) const {
    std::vector<const T*> parts(world_size());
    for (int r = 0; r < world_size(); r++) parts[r] = static_cast<const T*>(all[r]) + offset;
    tree_sum(parts.data(), world_size(), n, out);
  }

  void count_traffic(size_t bytes_each_way) {
    traffic_.bytes_sent += bytes_each_way;
    traffic_.bytes_received += bytes_each_way;
  }

  void check_peer(int peer) const {
    TANDEM_CHECK(peer >= 0 && peer < world_size() && peer != rank_, "rank ", rank_, ": peer ", peer,
                 " is not another rank of a world of ", world_size());
  }

  std::shared_ptr<LocalGroup::Shared> shared_;
  int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int world_size) {
  TANDEM_CHECK(world_size >= 1, "a local group needs at least 1 rank, got ", world_size);
  shared_ = LocalFamily::make_group(world_size);
}

LocalGroup::~LocalGroup() = default;

int LocalGroup::world_size() const { return shared_->world_size; }

void LocalGroup::abort() { shared_->abort(); }

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  TANDEM_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " is not in a world of ",
               world_size());
  return std::make_unique<LocalCommunicator>(shared_, rank);
}

void run_local_ranks(int world_size, const std::function<void(Communicator&)>& fn) {
  LocalGroup group(world_size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; r++) comms.push_back(group.communicator(r));
  std::mutex failure_mutex;
  std::exception_ptr first_failure;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; r++) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (!first_failure) first_failure = std::current_exception();
        }
        // Ranks blocked in a collective with this one must not wait forever.
        group.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace tandem
