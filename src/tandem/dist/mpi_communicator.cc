#include "tandem/dist/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/dist/local_group.h"
#include "tandem/dist/tree_sum.h"

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

std::unique_ptr<Communicator> make_world_communicator() {
  if (launched_by_mpi()) return make_mpi_communicator();
  // One rank: a local group of one, which keeps itself alive through its communicator.
  LocalGroup single(1);
  return single.communicator(0);
}

#if TANDEM_HAVE_MPI

namespace {

// Floats per rank per MPI_Gather of reduce_sum (4 MiB).
constexpr size_t kReducePiece = size_t{1} << 20;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(what, " failed: ", std::string(text, length));
}

int as_count(size_t n, const char* what) {
  TANDEM_CHECK(n <= static_cast<size_t>(INT_MAX), what, ": ", n,
               " elements is more than one MPI call takes (", INT_MAX, ")");
  return static_cast<int>(n);
}

// MPI is initialized by the first communicator and finalized with the last, once.
struct MpiLifetime {
  std::mutex mutex;
  int communicators = 0;
  bool initialized_here = false;
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
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                "MPI_Init_thread");
      life.initialized_here = true;
    }
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    // Errors come back as codes (and then as tandem::Error naming the call), not aborts.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_size_);
    life.communicators++;
  }
  ~MpiCommunicator() override {
    MpiLifetime& life = mpi_lifetime();
    std::lock_guard<std::mutex> lock(life.mutex);
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

  void all_reduce_sum(float* data, size_t n) override {
    // Padded to a multiple of the world size; each rank sums one slice, then all gather.
    const size_t slice = (n + world_size_ - 1) / world_size_;
    std::vector<float> padded(slice * world_size_, 0.0f), mine(slice);
    std::memcpy(padded.data(), data, n * sizeof(float));
    reduce_scatter_sum(padded.data(), mine.data(), slice);
    all_gather(mine.data(), padded.data(), slice * sizeof(float));
    std::memcpy(data, padded.data(), n * sizeof(float));
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    const int c = as_count(count, "reduce_scatter_sum");
    std::vector<float> slices(count * world_size_);  // rank r's slice for this rank at r
    check_mpi(MPI_Alltoall(send, c, MPI_FLOAT, slices.data(), c, MPI_FLOAT, comm_),
              "MPI_Alltoall (reduce_scatter_sum)");
    sum_over_ranks(slices.data(), count, recv);
    count_traffic((world_size_ - 1) * count * sizeof(float));
  }

  void reduce_sum(const float* send, float* recv, size_t n, int root) override {
    TANDEM_CHECK(root >= 0 && root < world_size_, "reduce_sum: root ", root,
                 " is not a rank of a world of ", world_size_);
    // In pieces, so that the root holds world_size pieces at a time, not world_size copies
    // of the data (and no MPI count passes INT_MAX). Gathered into a buffer of its own, so
    // send may be recv on the root.
    const size_t piece = std::min(n, kReducePiece);
    std::vector<float> gathered(rank_ == root ? piece * world_size_ : 0);
    for (size_t begin = 0; begin < n; begin += piece) {
      const size_t length = std::min(piece, n - begin);
      const int c = as_count(length, "reduce_sum");
      check_mpi(MPI_Gather(send + begin, c, MPI_FLOAT, gathered.data(), c, MPI_FLOAT, root, comm_),
                "MPI_Gather (reduce_sum)");
      if (rank_ == root) sum_over_ranks(gathered.data(), length, recv + begin);
    }
    // Counted as a ring reduce moves it: (N - 1) / N of the data each way.
    count_traffic((world_size_ - 1) * n * sizeof(float) / world_size_);
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    const int b = as_count(bytes, "all_gather");
    check_mpi(MPI_Allgather(send, b, MPI_BYTE, recv, b, MPI_BYTE, comm_), "MPI_Allgather");
    count_traffic((world_size_ - 1) * bytes);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    TANDEM_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root,
                 " is not a rank of a world of ", world_size_);
    check_mpi(MPI_Bcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
    if (rank_ != root) {
      traffic_.bytes_received += bytes;
    } else if (world_size_ > 1) {
      traffic_.bytes_sent += bytes;
    }
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  void abort() noexcept override { MPI_Abort(comm_, 1); }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    check_mpi(MPI_Send(data, as_count(bytes, "send"), MPI_BYTE, peer, tag, comm_), "MPI_Send");
    traffic_.bytes_sent += bytes;
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    MPI_Status status;
    check_mpi(MPI_Recv(data, as_count(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &status),
              "MPI_Recv");
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    TANDEM_CHECK(static_cast<size_t>(received) == bytes, "recv from rank ", peer, " (tag ", tag,
                 "): expected ", bytes, " bytes, the matching send had ", received);
    traffic_.bytes_received += bytes;
  }

 private:
  // out[count] = tree sum over ranks of `slices`, which holds rank r's count floats at
  // r * count.
  void sum_over_ranks(const float* slices, size_t count, float* out) const {
    std::vector<const float*> parts(world_size_);
    for (int r = 0; r < world_size_; r++) parts[r] = slices + r * count;
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

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_size_ = 1;
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
