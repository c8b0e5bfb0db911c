#include "tandem/comm/mpi_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/comm/local_group.h"
#include "tandem/comm/polling_backoff.h"
#include "tandem/comm/tree_sum.h"
#include "tandem/core/error.h"

#if TANDEM_HAVE_MPI
#include <mpi.h>
#endif

namespace tandem {

bool launched_by_mpi() {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(variable) != nullptr) return true;
  }
  return false;
}

std::string mpirun_options(int ranks) {
  std::string options;
  if (::geteuid() == 0) options += " --allow-run-as-root";
  if (ranks > static_cast<int>(std::thread::hardware_concurrency())) options += " --oversubscribe";
  return options + " -np " + std::to_string(ranks);
}

std::unique_ptr<Communicator> make_world_communicator() {
  if (launched_by_mpi()) return make_mpi_communicator();
  // One rank: a local group of one, which keeps itself alive through its communicator.
  LocalGroup single(1);
  return single.communicator(0);
}

#if TANDEM_HAVE_MPI

namespace {

using Clock = std::chrono::steady_clock;

// Floats per rank per exchange of reduce_sum (4 MiB).
constexpr size_t kReducePiece = size_t{1} << 20;
// Bytes per MPI message: MPI counts are int, so a longer buffer goes as several messages
// (in order: MPI does not let messages of one pair, communicator and tag overtake).
constexpr size_t kMaxMessage = size_t{1} << 30;
// How long a failed exchange waits for its cancelled receives to be done with.
constexpr auto kCancelWait = std::chrono::milliseconds(100);

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

void check_mpi(int code, std::string_view what) {
  if (code == MPI_SUCCESS) return;
  fail(what, " failed: ", mpi_error_text(code));
}

// MPI is initialized by the first communicator and finalized with the last, once.
struct MpiLifetime {
  std::mutex mutex;
  int communicators = 0;
  bool initialized_here = false;
  int thread_level = MPI_THREAD_SINGLE;  // what MPI provides
};
MpiLifetime& mpi_lifetime() {
  static MpiLifetime lifetime;
  return lifetime;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MpiLifetime& life = mpi_lifetime();
    std::lock_guard<std::mutex> lock(life.mutex);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // Threads of their own may run collectives (CollectiveQueue, overlap_comm) beside the
      // training thread's exchanges: MPI_THREAD_MULTIPLE where the library has it.
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                "MPI_Init_thread");
      life.initialized_here = true;
    }
    MPI_Query_thread(&life.thread_level);
    // Point to point on one duplicate, collectives on another: a user's tags never meet
    // the collectives' (which count the collectives, so that no message of one collective
    // can be taken for another's).
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &collectives_), "MPI_Comm_dup");
    // Errors come back as codes (and then as tandem::Error naming the call), not aborts.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(collectives_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_size_);
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(collectives_, MPI_TAG_UB, &tag_ub, &found);
    tag_ub_ = found && tag_ub != nullptr ? *tag_ub : 32767;  // the least MPI promises
    life.communicators++;
  }
  ~MpiCommunicator() override {
    // Messages of a failed exchange that could not be cancelled may still land in its
    // buffers: those stay allocated for good.
    if (!graveyard_.empty()) (void)new std::vector<std::shared_ptr<void>>(std::move(graveyard_));
    MpiLifetime& life = mpi_lifetime();
    std::lock_guard<std::mutex> lock(life.mutex);
    MPI_Comm_free(&collectives_);
    MPI_Comm_free(&comm_);
    if (--life.communicators == 0 && life.initialized_here) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend() const override { return "mpi"; }

  std::unique_ptr<Communicator> duplicate() override {
    check_usable();
    {
      MpiLifetime& life = mpi_lifetime();
      std::lock_guard<std::mutex> lock(life.mutex);
      if (life.thread_level < MPI_THREAD_MULTIPLE) return nullptr;
    }
    auto copy = std::make_unique<MpiCommunicator>();
    copy->set_timeout(timeout_);
    return copy;
  }

  void all_reduce_sum(float* data, size_t n) override { all_reduce(data, n, "all_reduce_sum"); }
  void all_reduce_sum_bf16(Bf16* data, size_t n) override {
    all_reduce(data, n, "all_reduce_sum_bf16");
  }

  template <typename T>
  void all_reduce(T* data, size_t n, const char* what) {
    check_usable();
    // Rank r sums the slice [r * slice, (r + 1) * slice) of data (the last ones shorter or
    // empty when the world size does not divide n), then every rank gathers every slice.
    const size_t slice = (n + world_size_ - 1) / world_size_;
    const auto begin = [&](int r) { return std::min(n, r * slice); };
    const auto length = [&](int r) { return std::min(n, (r + 1) * slice) - begin(r); };
    const size_t mine = length(rank_);
    const int tag = next_tag();
    std::vector<T> theirs((world_size_ - 1) * mine);  // the peers' values of my slice
    {
      Exchange exchange(*this, collectives_, tag, what);
      exchange.keep_alive(theirs);
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + world_size_ - k) % world_size_;
        exchange.recv(theirs.data() + slot(peer) * mine, mine * sizeof(T), peer);
      }
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + k) % world_size_;
        exchange.send(data + begin(peer), length(peer) * sizeof(T), peer);
      }
      exchange.wait();
    }
    if (mine > 0) sum_over_ranks(data + begin(rank_), theirs.data(), mine, data + begin(rank_));
    {
      Exchange exchange(*this, collectives_, tag, what);
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + world_size_ - k) % world_size_;
        exchange.recv(data + begin(peer), length(peer) * sizeof(T), peer);
      }
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + k) % world_size_;
        exchange.send(data + begin(rank_), mine * sizeof(T), peer);
      }
      exchange.wait();
    }
    // Counted as a ring moves it: a reduce-scatter and an all-gather of the slices.
    count_traffic(2 * (world_size_ - 1) * slice * sizeof(T));
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    check_usable();
    std::vector<float> theirs((world_size_ - 1) * count);  // the peers' slices for this rank
    {
      Exchange exchange(*this, collectives_, next_tag(), "reduce_scatter_sum");
      exchange.keep_alive(theirs);
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + world_size_ - k) % world_size_;
        exchange.recv(theirs.data() + slot(peer) * count, count * sizeof(float), peer);
      }
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + k) % world_size_;
        exchange.send(send + peer * count, count * sizeof(float), peer);
      }
      exchange.wait();
    }
    sum_over_ranks(send + rank_ * count, theirs.data(), count, recv);
    count_traffic((world_size_ - 1) * count * sizeof(float));
  }

  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    reduce(send, recv, n, root, "reduce_sum");
  }
  void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) override {
    reduce(send, recv, n, root, "reduce_sum_bf16");
  }

  template <typename T>
  void reduce(const T* send, T* recv, size_t n, int root, const char* what) {
    TANDEM_CHECK(root >= 0 && root < world_size_, what, ": root ", root,
                 " is not a rank of a world of ", world_size_);
    check_usable();
    // In pieces, so that the root holds world_size pieces at a time, not world_size copies
    // of the data. The root's own piece is summed from send, so send may be recv there.
    const size_t piece = std::min(n, kReducePiece);
    const int tag = next_tag();
    std::vector<T> theirs(rank_ == root ? piece * (world_size_ - 1) : 0);
    for (size_t begin = 0; begin < n; begin += piece) {
      const size_t length = std::min(piece, n - begin);
      {
        Exchange exchange(*this, collectives_, tag, what);
        exchange.keep_alive(theirs);
        if (rank_ == root) {
          for (int peer = 0; peer < world_size_; peer++) {
            if (peer != root)
              exchange.recv(theirs.data() + slot(peer) * length, length * sizeof(T), peer);
          }
        } else {
          exchange.send(send + begin, length * sizeof(T), root);
        }
        exchange.wait();
      }
      if (rank_ == root) sum_over_ranks(send + begin, theirs.data(), length, recv + begin);
    }
    // Counted as a ring reduce moves it: (N - 1) / N of the data each way.
    count_traffic((world_size_ - 1) * n * sizeof(T) / world_size_);
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    check_usable();
    char* all = static_cast<char*>(recv);
    std::memmove(all + rank_ * bytes, send, bytes);
    Exchange exchange(*this, collectives_, next_tag(), "all_gather");
    for (int k = 1; k < world_size_; k++) {
      const int peer = (rank_ + world_size_ - k) % world_size_;
      exchange.recv(all + peer * bytes, bytes, peer);
    }
    for (int k = 1; k < world_size_; k++)
      exchange.send(all + rank_ * bytes, bytes, (rank_ + k) % world_size_);
    exchange.wait();
    count_traffic((world_size_ - 1) * bytes);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    TANDEM_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root,
                 " is not a rank of a world of ", world_size_);
    check_usable();
    Exchange exchange(*this, collectives_, next_tag(), "broadcast");
    if (rank_ == root) {
      for (int k = 1; k < world_size_; k++) exchange.send(data, bytes, (rank_ + k) % world_size_);
    } else {
      exchange.recv(data, bytes, root);
    }
    exchange.wait();
    if (rank_ != root) {
      traffic_.bytes_received += bytes;
    } else if (world_size_ > 1) {
      traffic_.bytes_sent += bytes;
    }
  }

  // An empty message to and from every other rank: done once every rank has arrived.
  void barrier() override {
    check_usable();
    static char nothing = 0;
    Exchange exchange(*this, collectives_, next_tag(), "barrier");
    for (int k = 1; k < world_size_; k++)
      exchange.recv(&nothing, 0, (rank_ + world_size_ - k) % world_size_);
    for (int k = 1; k < world_size_; k++) exchange.send(&nothing, 0, (rank_ + k) % world_size_);
    exchange.wait();
  }

  void abort() noexcept override { MPI_Abort(comm_, 1); }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    check_usable();
    Exchange exchange(*this, comm_, tag, cat("send (tag ", tag, ")"));
    exchange.send(data, bytes, peer);
    exchange.wait();
    traffic_.bytes_sent += bytes;
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    check_usable();
    Exchange exchange(*this, comm_, tag, cat("recv (tag ", tag, ")"));
    exchange.recv(data, bytes, peer);
    exchange.wait();
    traffic_.bytes_received += bytes;
  }

 private:
  // The messages of one exchange, posted at once (MPI_Irecv, MPI_Isend) and waited for
  // together within the timeout. After a failure (an error, the timeout) the destructor
  // cancels the receives still posted and lets go of the rest.
  class Exchange {
   public:
    Exchange(MpiCommunicator& owner, MPI_Comm comm, int tag, std::string what)
        : owner_(owner), comm_(comm), tag_(tag), what_(std::move(what)) {}
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    ~Exchange() { abandon(); }

    void recv(void* data, size_t bytes, int peer) { post(true, data, bytes, peer); }
    void send(const void* data, size_t bytes, int peer) {
      post(false, const_cast<void*>(data), bytes, peer);
    }
    // A buffer of the owner's that this exchange's receives write into: kept allocated
    // for good if one of them cannot be cancelled after a failure.
    template <typename T>
    void keep_alive(std::vector<T>& buffer) {
      buffers_.push_back([&buffer] {
        return std::shared_ptr<void>(new std::vector<T>(std::move(buffer)),
                                     [](void* p) { delete static_cast<std::vector<T>*>(p); });
      });
    }

    // Until every message is done; throws naming the peers still missing at the timeout.
    void wait() {
      const size_t count = requests_.size();
      if (count == 0) return;
      PollingBackoff backoff(owner_.timeout_);
      std::vector<int> done_at(count);
      std::vector<MPI_Status> statuses(count);
      for (;;) {
        int done = 0;
        const int code = MPI_Testsome(static_cast<int>(count), requests_.data(), &done,
                                      done_at.data(), statuses.data());
        if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS)
          failed(cat("MPI_Testsome failed: ", mpi_error_text(code)));
        if (done == MPI_UNDEFINED) return;  // every request is done
        for (int i = 0; i < done; i++) {
          check_message(messages_[done_at[i]], statuses[i], code == MPI_ERR_IN_STATUS);
        }
        if (done > 0) {
          backoff.progressed();
        } else if (backoff.expired()) {
          timed_out();
        } else {
          backoff.pause();
        }
      }
    }

   private:
    struct Message {
      int peer;
      bool receive;
      size_t bytes;
    };

    void post(bool receive, void* data, size_t bytes, int peer) {
      char* at = static_cast<char*>(data);
      size_t offset = 0;
      do {
        const size_t length = std::min(kMaxMessage, bytes - offset);
        const int count = static_cast<int>(length);
        MPI_Request request = MPI_REQUEST_NULL;
        const int code = receive
                             ? MPI_Irecv(at + offset, count, MPI_BYTE, peer, tag_, comm_, &request)
                             : MPI_Isend(at + offset, count, MPI_BYTE, peer, tag_, comm_, &request);
        check_mpi(code, cat(receive ? "MPI_Irecv" : "MPI_Isend", " (", what_, ")"));
        requests_.push_back(request);
        messages_.push_back({peer, receive, length});
        offset += length;
      } while (offset < bytes);
    }

    void check_message(const Message& message, const MPI_Status& status, bool in_status) {
      const int error = in_status ? status.MPI_ERROR : MPI_SUCCESS;
      int error_class = error;
      if (error != MPI_SUCCESS) MPI_Error_class(error, &error_class);
      if (message.receive && error_class == MPI_ERR_TRUNCATE) mismatch(message, "more");
      if (error != MPI_SUCCESS) {
        failed(cat("rank ", owner_.rank_, ": ", what_, (message.receive ? " from" : " to"),
                   " rank ", message.peer, " failed: ", mpi_error_text(error)));
      }
      if (!message.receive) return;
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (static_cast<size_t>(received) != message.bytes) mismatch(message, received);
    }

    template <typename Had>
    [[noreturn]] void mismatch(const Message& message, const Had& had) {
      if (comm_ != owner_.collectives_) {
        failed(cat(what_, " from rank ", message.peer, ": expected ", message.bytes,
                   " bytes, the matching send had ", had));
      }
      failed(cat("rank ", owner_.rank_, ": ", what_, ": rank ", message.peer, " sent ", had,
                 " bytes where this rank expected ", message.bytes,
                 "; every rank must make the same collective calls with the same sizes"));
    }

    [[noreturn]] void timed_out() {
      std::vector<int> no_data, not_taken;
      for (size_t i = 0; i < requests_.size(); i++) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        (messages_[i].receive ? no_data : not_taken).push_back(messages_[i].peer);
      }
      std::vector<int>& missing = no_data.empty() ? not_taken : no_data;
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      try {
        fail_communicator_timeout(owner_.rank_, missing, !no_data.empty(), owner_.timeout_, what_);
      } catch (const Error& e) {
        owner_.broken_ = e.what();
        throw;
      }
    }

    // Throws `message`; a failed collective leaves the ranks out of step, so the owner
    // refuses later calls.
    [[noreturn]] void failed(const std::string& message) {
      if (comm_ == owner_.collectives_) owner_.broken_ = message;
      throw Error(message);
    }

    // Cancels the receives still posted (a late message must not land in a buffer that is
    // gone) and frees every request; sends, which MPI cannot take back, are let go.
    void abandon() noexcept {
      bool posted = false;
      for (size_t i = 0; i < requests_.size(); i++) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        posted = true;
        if (messages_[i].receive) MPI_Cancel(&requests_[i]);
      }
      if (!posted) return;
      const Clock::time_point give_up = Clock::now() + kCancelWait;
      bool receiving = true;
      while (receiving && Clock::now() < give_up) {
        receiving = false;
        for (size_t i = 0; i < requests_.size(); i++) {
          if (requests_[i] == MPI_REQUEST_NULL || !messages_[i].receive) continue;
          int done = 0;
          MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE);
          receiving = receiving || !done;
        }
        if (receiving) std::this_thread::sleep_for(PollingBackoff::kFirstPause);
      }
      for (MPI_Request& request : requests_) {
        if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
      }
      if (receiving) {
        for (const auto& take : buffers_) owner_.graveyard_.push_back(take());
      }
    }

    MpiCommunicator& owner_;
    MPI_Comm comm_;
    int tag_;
    std::string what_;
    std::vector<MPI_Request> requests_;
    std::vector<Message> messages_;
    // For each buffer that pending receives may still write into: takes it over.
    std::vector<std::function<std::shared_ptr<void>()>> buffers_;
  };

  // The tag of the next collective: every rank counts its collectives the same.
  int next_tag() {
    const int tag = static_cast<int>(collective_count_ % (static_cast<uint64_t>(tag_ub_) + 1));
    collective_count_++;
    return tag;
  }
  // Where peer's part goes in a buffer of the world_size - 1 other ranks' parts.
  int slot(int peer) const { return peer < rank_ ? peer : peer - 1; }

  // out[count] = tree sum over ranks of their count floats: this rank's at mine, the
  // others' at theirs + slot(r) * count. out may be mine itself.
  template <typename T>
  void sum_over_ranks(const T* mine, const T* theirs, size_t count, T* out) const {
    std::vector<const T*> parts(world_size_);
    for (int r = 0; r < world_size_; r++) parts[r] = r == rank_ ? mine : theirs + slot(r) * count;
    tree_sum(parts.data(), world_size_, count, out);
  }
  void count_traffic(size_t bytes_each_way) {
    traffic_.bytes_sent += bytes_each_way;
    traffic_.bytes_received += bytes_each_way;
  }
  void check_peer(int peer) const {
    TANDEM_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": peer ", peer,
                 " is not another rank of a world of ", world_size_);
  }
  // After a timeout or a failed collective, which messages arrived is unknown: refused.
  void check_usable() const {
    TANDEM_CHECK(broken_.empty(), "rank ", rank_,
                 ": this MPI communicator cannot be used after an earlier failure (", broken_,
                 "); stop the job (Communicator::abort)");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;         // point to point
  MPI_Comm collectives_ = MPI_COMM_NULL;  // collectives, tagged by next_tag
  int rank_ = 0, world_size_ = 1;
  int tag_ub_ = 32767;
  uint64_t collective_count_ = 0;
  std::string broken_;  // why this communicator refuses calls; empty while usable
  std::vector<std::shared_ptr<void>> graveyard_;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

#else  // !TANDEM_HAVE_MPI

bool mpi_available() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator() {
  fail(
      "this tandem was built without MPI; install Debian's openmpi-bin and libopenmpi-dev "
      "(make deps does) and rebuild, or run without mpirun (one rank)");
}

#endif

}  // namespace tandem
