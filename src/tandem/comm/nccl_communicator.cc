#include "tandem/comm/nccl_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/comm/polling_backoff.h"
#include "tandem/core/error.h"

#if TANDEM_HAVE_NCCL
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace tandem {

namespace {

// "1st", "2nd", "3rd", "4th", ..., "11th", ..., "21st".
std::string ordinal(int k) {
  const int tens = k % 100, ones = k % 10;
  const char* suffix = "th";
  if (tens < 11 || tens > 13) {
    if (ones == 1) suffix = "st";
    if (ones == 2) suffix = "nd";
    if (ones == 3) suffix = "rd";
  }
  return std::to_string(k) + suffix;
}

}  // namespace

int nccl_device_of_rank(const std::vector<NcclRankPlace>& places, int rank) {
  const int world = static_cast<int>(places.size());
  TANDEM_CHECK(rank >= 0 && rank < world, "nccl_device_of_rank: rank ", rank,
               " is not a rank of a world of ", world);
  // A rank's GPU: how many ranks before it share its host and its visible devices.
  const auto local_rank = [&](int r) {
    int before = 0;
    for (int q = 0; q < r; q++) {
      before += places[q].host == places[r].host &&
                places[q].visible_devices == places[r].visible_devices;
    }
    return before;
  };
  const auto no_gpu = [&](int r) {
    const std::string who = r == rank ? std::string("this machine") : cat("rank ", r, "'s machine");
    fail("NCCL needs a GPU per rank; ", who, " (host ", places[r].host, ") has none (",
         places[r].no_gpu_reason.empty() ? std::string("cudaGetDeviceCount: 0 devices")
                                         : places[r].no_gpu_reason,
         "); run the MPI backend on the cpu device");
  };
  if (places[rank].gpu_count <= 0) no_gpu(rank);
  for (int r = 0; r < world; r++) {
    if (places[r].gpu_count <= 0) no_gpu(r);
  }
  for (int r = 0; r < world; r++) {
    const int local = local_rank(r), gpus = places[r].gpu_count;
    if (local < gpus) continue;
    fail("rank ", r, " is the ", ordinal(local + 1), " rank on host ", places[r].host,
         ", which has ", gpus, gpus == 1 ? " GPU" : " GPUs",
         places[r].visible_devices.empty()
             ? ""
             : cat(" (CUDA_VISIBLE_DEVICES=", places[r].visible_devices, ")"),
         "; start at most one rank per GPU (mpirun --map-by ppr:", gpus, ":node)");
  }
  return local_rank(rank);
}

#if TANDEM_HAVE_NCCL

namespace {

// Floats per rank per exchange of reduce_sum (16 MiB): the root stages world_size pieces.
constexpr size_t kReducePiece = size_t{1} << 22;
// Floats per cublasSaxpy call (its n is an int).
constexpr size_t kSaxpyChunk = size_t{1} << 30;

// Fixed-size strings for the all-gather of the ranks' places.
constexpr size_t kHostBytes = 256, kReasonBytes = 512;

template <size_t N>
void copy_text(char (&to)[N], std::string_view from) {
  const size_t length = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), length);
  std::memset(to + length, 0, N - length);
}
template <size_t N>
std::string text_of(const char (&from)[N]) {
  return std::string(from, strnlen(from, N));
}

std::string host_name() {
  char name[kHostBytes] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

void check_cuda(cudaError_t code, std::string_view what) {
  if (code == cudaSuccess) return;
  cudaGetLastError();  // not sticky: the next call must not see it again
  fail("CUDA error in ", what, ": ", cudaGetErrorString(code));
}

void check_cublas(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail("cuBLAS error in ", what, ": ", cublasGetStatusString(status));
}

// libnccl, loaded at run time: the few entry points the backend calls. RTLD_NODELETE:
// closing the handle never unmaps NCCL (whose threads may outlive a communicator).
class NcclLibrary {
 public:
  NcclLibrary() {
    const char* chosen = std::getenv(kNcclLibraryVariable);
    path_ = chosen != nullptr && *chosen != '\0' ? chosen : "libnccl.so.2";
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      fail("cannot load the NCCL library ", path_, " (", why != nullptr ? why : "not found",
           "); the nccl backend loads it at run time: install NCCL 2 (NVIDIA's libnccl2 "
           "package, or PyTorch's nvidia-nccl wheel) and put the directory of libnccl.so.2 on "
           "LD_LIBRARY_PATH, or set ",
           kNcclLibraryVariable, " to its path");
    }
    bind(get_unique_id, "ncclGetUniqueId");
    bind(comm_init_rank, "ncclCommInitRank");
    bind(comm_destroy, "ncclCommDestroy");
    bind(comm_abort, "ncclCommAbort");
    bind(get_error_string, "ncclGetErrorString");
    bind(comm_get_async_error, "ncclCommGetAsyncError");
    bind(send, "ncclSend");
    bind(recv, "ncclRecv");
    bind(all_gather, "ncclAllGather");
    bind(broadcast, "ncclBroadcast");
    bind(group_start, "ncclGroupStart");
    bind(group_end, "ncclGroupEnd");
    // Newer than the rest (2.13): a detail for error messages, used when there.
    get_last_error =
        reinterpret_cast<decltype(&::ncclGetLastError)>(dlsym(handle_, "ncclGetLastError"));
  }
  ~NcclLibrary() { dlclose(handle_); }
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  // "ncclSend (all_reduce_sum) failed: unhandled system error (detail)".
  [[noreturn]] void fail_with(ncclResult_t result, ncclComm_t comm, std::string_view what) const {
    std::string detail;
    if (get_last_error != nullptr) {
      const char* last = get_last_error(comm);
      if (last != nullptr && *last != '\0') detail = cat(" (", last, ")");
    }
    for (char& c : detail) {
      if (c == '\n') c = ' ';
    }
    fail(what, " failed: ", get_error_string(result), detail);
  }

  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;

 private:
  template <typename Function>
  void bind(Function& function, const char* name) {
    function = reinterpret_cast<Function>(dlsym(handle_, name));
    TANDEM_CHECK(function != nullptr, path_, " has no ", name,
                 "; tandem needs NCCL 2.7 or later (NVIDIA's libnccl2 package, or PyTorch's "
                 "nvidia-nccl wheel) on LD_LIBRARY_PATH, or ",
                 kNcclLibraryVariable, " set to its path");
  }

  std::string path_;
  void* handle_ = nullptr;
};

// The tree sum of `count` arrays of n floats at `slots`, `stride` floats apart, into
// slots[0, n), on the handle's stream. In place and strided: at the level where values are
// `step` slots apart, slot i (i a multiple of 2 step) gets slot i + step added; an odd last
// value stays in its slot, which is where the next level looks for it. That is the tree of
// tree_sum.h (left + right, and IEEE addition commutes: 1 * right + left is left + right).
// left[n] = 1 * right[n] + left[n]: IEEE fp32 for floats; for bf16, computed in fp32 and
// rounded to bf16, as the bf16 backends add (cublasAxpyEx, bf16 in and out, fp32 inside).
void add_into(cublasHandle_t cublas, float* left, const float* right, int n,
              std::string_view what) {
  const float one = 1.0f;
  check_cublas(cublasSaxpy(cublas, n, &one, right, 1, left, 1), cat("cublasSaxpy (", what, ")"));
}
void add_into(cublasHandle_t cublas, Bf16* left, const Bf16* right, int n, std::string_view what) {
  const float one = 1.0f;
  check_cublas(cublasAxpyEx(cublas, n, &one, CUDA_R_32F, right, CUDA_R_16BF, 1, left, CUDA_R_16BF,
                            1, CUDA_R_32F),
               cat("cublasAxpyEx bf16 (", what, ")"));
}

template <typename T>
void tree_sum_slots(cublasHandle_t cublas, T* slots, int count, size_t stride, size_t n,
                    std::string_view what) {
  for (int step = 1; step < count; step *= 2) {
    for (int i = 0; i + step < count; i += 2 * step) {
      T* left = slots + static_cast<size_t>(i) * stride;
      const T* right = slots + static_cast<size_t>(i + step) * stride;
      for (size_t begin = 0; begin < n; begin += kSaxpyChunk) {
        const int length = static_cast<int>(std::min(kSaxpyChunk, n - begin));
        add_into(cublas, left + begin, right + begin, length, what);
      }
    }
  }
}

// NCCL's name for an element type.
ncclDataType_t nccl_type(const float*) { return ncclFloat; }
ncclDataType_t nccl_type(const Bf16*) { return ncclBfloat16; }

// What one rank tells the others before NCCL starts (all-gathered as bytes).
struct PlaceRecord {
  char host[kHostBytes];
  char visible_devices[kHostBytes];
  char no_gpu_reason[kReasonBytes];
  char library_problem[kReasonBytes];  // why libnccl could not be loaded; empty if it was
  int32_t gpu_count;
  int32_t unused;
};

// Rank 0's NCCL id, or why it has none.
struct IdRecord {
  char problem[kReasonBytes];
  ncclUniqueId id;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, std::unique_ptr<NcclLibrary> nccl, int device,
                   const ncclUniqueId& id)
      : bootstrap_(bootstrap),
        nccl_(std::move(nccl)),
        rank_(bootstrap.rank()),
        world_size_(bootstrap.world_size()),
        device_(device) {
    try {
      check_cuda(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
      const ncclResult_t result = nccl_->comm_init_rank(&comm_, world_size_, id, rank_);
      if (result != ncclSuccess) {
        comm_ = nullptr;
        nccl_->fail_with(result, nullptr,
                         cat("rank ", rank_, ": ncclCommInitRank on GPU ", device_));
      }
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      check_cublas(cublasCreate(&cublas_), "cublasCreate");
      check_cublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
      check_cublas(cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override { release(); }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend() const override { return "nccl"; }
  int device() const { return device_; }

  void all_reduce_sum(float* data, size_t n) override { all_reduce(data, n, "all_reduce_sum"); }
  void all_reduce_sum_bf16(Bf16* data, size_t n) override {
    all_reduce(data, n, "all_reduce_sum_bf16");
  }

  template <typename T>
  void all_reduce(T* data, size_t n, const char* what) {
    guarded([&] {
      if (n == 0) return;
      // Rank r sums the slice [r * slice, (r + 1) * slice) of data (the last ones shorter or
      // empty when the world size does not divide n), then every rank gathers every slice.
      const size_t slice = (n + world_size_ - 1) / world_size_;
      const auto begin = [&](int r) { return std::min(n, r * slice); };
      const auto length = [&](int r) { return std::min(n, (r + 1) * slice) - begin(r); };
      const size_t mine = length(rank_);
      T* work = workspace_of<T>(world_size_ * slice);
      // Every rank's values of my slice into slot r of the work area (stride mine).
      group_start(what);
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + world_size_ - k) % world_size_;
        if (mine > 0) recv_elements(work + peer * mine, mine, peer, what);
      }
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + k) % world_size_;
        if (length(peer) > 0) send_elements(data + begin(peer), length(peer), peer, what);
      }
      group_end(what);
      copy(work + rank_ * mine, data + begin(rank_), mine * sizeof(T), what);
      tree_sum_slots(cublas_, work, world_size_, mine, mine, what);
      // The sums, slice by slice, to every rank: in place in data when the slices are all
      // full; else through the work area (world_size full slices), then back into data.
      if (n % world_size_ == 0) {
        copy(data + rank_ * slice, work, slice * sizeof(T), what);
        all_gather_bytes(data + rank_ * slice, data, slice * sizeof(T), what);
      } else {
        // Slot 0 (the sum) and slot rank_ do not overlap for rank_ > 0: mine <= slice.
        if (rank_ > 0) copy(work + rank_ * slice, work, mine * sizeof(T), what);
        all_gather_bytes(work + rank_ * slice, work, slice * sizeof(T), what);
        copy(data, work, n * sizeof(T), what);
      }
      wait(what);
      // Counted as a ring moves it: a reduce-scatter and an all-gather of the slices.
      count_traffic(2 * (world_size_ - 1) * slice * sizeof(T));
    });
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    guarded([&] {
      if (count == 0) return;
      float* work = workspace(world_size_ * count);
      group_start("reduce_scatter_sum");
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + world_size_ - k) % world_size_;
        recv_elements(work + peer * count, count, peer, "reduce_scatter_sum");
      }
      for (int k = 1; k < world_size_; k++) {
        const int peer = (rank_ + k) % world_size_;
        send_elements(send + peer * count, count, peer, "reduce_scatter_sum");
      }
      group_end("reduce_scatter_sum");
      copy(work + rank_ * count, send + rank_ * count, count * sizeof(float), "reduce_scatter_sum");
      tree_sum_slots(cublas_, work, world_size_, count, count, "reduce_scatter_sum");
      copy(recv, work, count * sizeof(float), "reduce_scatter_sum");
      wait("reduce_scatter_sum");
      count_traffic((world_size_ - 1) * count * sizeof(float));
    });
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
    guarded([&] {
      if (n == 0) return;
      // In pieces, so that the root stages world_size pieces, not world_size copies of the
      // data. The root's own piece is copied from send before its sum is written, so send
      // may be recv there.
      const size_t piece = std::min(n, kReducePiece);
      T* work = rank_ == root ? workspace_of<T>(world_size_ * piece) : nullptr;
      for (size_t begin = 0; begin < n; begin += piece) {
        const size_t length = std::min(piece, n - begin);
        group_start(what);
        if (rank_ == root) {
          for (int peer = 0; peer < world_size_; peer++) {
            if (peer != root) recv_elements(work + peer * length, length, peer, what);
          }
        } else {
          send_elements(send + begin, length, root, what);
        }
        group_end(what);
        if (rank_ == root) {
          copy(work + root * length, send + begin, length * sizeof(T), what);
          tree_sum_slots(cublas_, work, world_size_, length, length, what);
          copy(recv + begin, work, length * sizeof(T), what);
        }
        wait(what);
      }
      // Counted as a ring reduce moves it: (N - 1) / N of the data each way.
      count_traffic((world_size_ - 1) * n * sizeof(T) / world_size_);
    });
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    guarded([&] {
      if (bytes == 0) return;
      const char* from = static_cast<const char*>(send);
      char* all = static_cast<char*>(recv);
      // NCCL takes send inside recv only at this rank's place: elsewhere, staged first.
      const bool overlaps = from < all + world_size_ * bytes && all < from + bytes;
      if (overlaps && from != all + rank_ * bytes) {
        float* staged = workspace((bytes + sizeof(float) - 1) / sizeof(float));
        copy(staged, from, bytes, "all_gather");
        from = reinterpret_cast<const char*>(staged);
      }
      all_gather_bytes(from, all, bytes, "all_gather");
      wait("all_gather");
      count_traffic((world_size_ - 1) * bytes);
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    TANDEM_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root,
                 " is not a rank of a world of ", world_size_);
    guarded([&] {
      if (bytes == 0) return;
      call(nccl_->broadcast(data, data, bytes, ncclUint8, root, comm_, stream_),
           "ncclBroadcast (broadcast)");
      wait("broadcast");
      if (rank_ != root) {
        traffic_.bytes_received += bytes;
      } else if (world_size_ > 1) {
        traffic_.bytes_sent += bytes;
      }
    });
  }

  // A float from every rank to every rank: done once every rank has arrived.
  void barrier() override {
    guarded([&] {
      float* work = workspace(world_size_);
      all_gather_bytes(work + rank_, work, sizeof(float), "barrier");
      wait("barrier");
    });
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    guarded([&] {
      if (bytes == 0) return;
      const std::string what = cat("send (tag ", tag, ")");
      call(nccl_->send(data, bytes, ncclUint8, peer, comm_, stream_), cat("ncclSend (", what, ")"));
      wait(what);
      traffic_.bytes_sent += bytes;
    });
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    guarded([&] {
      if (bytes == 0) return;
      const std::string what = cat("recv (tag ", tag, ")");
      call(nccl_->recv(data, bytes, ncclUint8, peer, comm_, stream_), cat("ncclRecv (", what, ")"));
      wait(what);
      traffic_.bytes_received += bytes;
    });
  }

  void abort() noexcept override {
    if (comm_ != nullptr) {
      nccl_->comm_abort(comm_);
      comm_ = nullptr;
    }
    bootstrap_.abort();
  }

 private:
  // Runs one call's work on this rank's GPU; a failure leaves the ranks out of step, so
  // the communicator refuses every later call.
  template <typename Work>
  void guarded(Work&& work) {
    TANDEM_CHECK(broken_.empty(), "rank ", rank_,
                 ": this NCCL communicator cannot be used after an earlier failure (", broken_,
                 "); stop the job (Communicator::abort)");
    try {
      check_cuda(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
      work();
    } catch (const Error& e) {
      broken_ = e.what();
      throw;
    }
  }

  void call(ncclResult_t result, std::string_view what) const {
    if (result != ncclSuccess) nccl_->fail_with(result, comm_, cat("rank ", rank_, ": ", what));
  }
  void group_start(std::string_view what) {
    call(nccl_->group_start(), cat("ncclGroupStart (", what, ")"));
  }
  void group_end(std::string_view what) {
    call(nccl_->group_end(), cat("ncclGroupEnd (", what, ")"));
  }
  template <typename T>
  void send_elements(const T* data, size_t count, int peer, std::string_view what) {
    call(nccl_->send(data, count, nccl_type(data), peer, comm_, stream_),
         cat("ncclSend (", what, ")"));
  }
  template <typename T>
  void recv_elements(T* data, size_t count, int peer, std::string_view what) {
    call(nccl_->recv(data, count, nccl_type(data), peer, comm_, stream_),
         cat("ncclRecv (", what, ")"));
  }
  // The staging area as `count` elements of T.
  template <typename T>
  T* workspace_of(size_t count) {
    return reinterpret_cast<T*>(workspace((count * sizeof(T) + sizeof(float) - 1) / sizeof(float)));
  }
  // Every rank's `bytes` at `send` to every rank, rank r's at all + r * bytes.
  void all_gather_bytes(const void* send, void* all, size_t bytes, std::string_view what) {
    call(nccl_->all_gather(send, all, bytes, ncclUint8, comm_, stream_),
         cat("ncclAllGather (", what, ")"));
  }
  void copy(void* to, const void* from, size_t bytes, std::string_view what) {
    if (bytes == 0 || to == from) return;
    check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_),
               cat("cudaMemcpyAsync (", what, ")"));
  }

  // Until the stream is done, within the timeout; an error of CUDA or of NCCL (which
  // reports a failed peer or network asynchronously) throws.
  void wait(std::string_view what) {
    PollingBackoff backoff(timeout_);
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) {
        check_cuda(state, cat("rank ", rank_, ": ", what, " (cudaStreamQuery)"));
      }
      ncclResult_t async = ncclSuccess;
      call(nccl_->comm_get_async_error(comm_, &async), cat("ncclCommGetAsyncError (", what, ")"));
      if (async != ncclSuccess && async != ncclInProgress) call(async, what);
      if (backoff.expired()) timed_out(what);
      backoff.pause();
    }
  }

  // The NCCL kernels of the call may never end: the communicator is aborted now (which
  // ends them), and what they touched is left allocated.
  [[noreturn]] void timed_out(std::string_view what) {
    nccl_->comm_abort(comm_);
    comm_ = nullptr;
    stuck_ = true;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", static_cast<double>(timeout_.count()) / 1000);
    fail("rank ", rank_, ": the NCCL ", what, " did not finish within ", seconds,
         " s (a rank dead or hung? NCCL does not say which); raise ", kCommTimeoutVariable,
         " if a rank is only slow");
  }

  // The staging area, at least `floats` long (grown, never shrunk; the stream is idle
  // between calls, so the old one can go).
  float* workspace(size_t floats) {
    if (floats > workspace_floats_) {
      if (workspace_ != nullptr) check_cuda(cudaFree(workspace_), "cudaFree");
      workspace_ = nullptr;
      workspace_floats_ = 0;
      const cudaError_t code = cudaMalloc(&workspace_, floats * sizeof(float));
      if (code != cudaSuccess) {
        cudaGetLastError();
        workspace_ = nullptr;
        fail("rank ", rank_, ": cudaMalloc of ", floats * sizeof(float),
             " bytes for the NCCL communicator's staging area on GPU ", device_,
             " failed: ", cudaGetErrorString(code));
      }
      workspace_floats_ = floats;
    }
    return workspace_;
  }

  void count_traffic(size_t bytes_each_way) {
    traffic_.bytes_sent += bytes_each_way;
    traffic_.bytes_received += bytes_each_way;
  }
  void check_peer(int peer) const {
    TANDEM_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": peer ", peer,
                 " is not another rank of a world of ", world_size_);
  }

  // Everything this communicator holds, in reverse order of its making; after a timeout
  // (kernels that may never end) only the NCCL communicator, already aborted.
  void release() noexcept {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (broken_.empty()) {
        nccl_->comm_destroy(comm_);
      } else {
        nccl_->comm_abort(comm_);
      }
      comm_ = nullptr;
    }
    if (stuck_) return;
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    cublas_ = nullptr;
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (workspace_ != nullptr) cudaFree(workspace_);
    workspace_ = nullptr;
    cudaGetLastError();
  }

  Communicator& bootstrap_;
  std::unique_ptr<NcclLibrary> nccl_;
  int rank_, world_size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  float* workspace_ = nullptr;
  size_t workspace_floats_ = 0;
  std::string broken_;  // why this communicator refuses calls; empty while usable
  bool stuck_ = false;  // a call timed out: its kernels may still hold the stream
};

}  // namespace

bool nccl_available() { return true; }

int nccl_communicator_device(const Communicator& comm) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm);
  TANDEM_CHECK(nccl != nullptr, "nccl_communicator_device: a ", comm.backend(),
               " communicator, not an NCCL one");
  return nccl->device();
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap) {
  const int rank = bootstrap.rank(), world = bootstrap.world_size();
  // This rank's place, and libnccl where there is a GPU to use it on.
  PlaceRecord mine{};
  const std::string host = host_name();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  copy_text(mine.host, host);
  copy_text(mine.visible_devices, visible != nullptr ? visible : "");
  int gpus = 0;
  const cudaError_t code = cudaGetDeviceCount(&gpus);
  if (code != cudaSuccess) {
    cudaGetLastError();
    gpus = 0;
    copy_text(mine.no_gpu_reason, cat("cudaGetDeviceCount: ", cudaGetErrorString(code)));
  } else if (gpus == 0) {
    copy_text(mine.no_gpu_reason, "cudaGetDeviceCount: 0 devices");
  }
  mine.gpu_count = gpus;
  std::unique_ptr<NcclLibrary> nccl;
  if (gpus > 0) {
    try {
      nccl = std::make_unique<NcclLibrary>();
    } catch (const Error& e) {
      copy_text(mine.library_problem, e.what());
    }
  }

  // Every rank's place, so that every rank decides the same (and fails together).
  std::vector<PlaceRecord> records(world);
  bootstrap.all_gather(&mine, records.data(), sizeof(PlaceRecord));
  std::vector<NcclRankPlace> places(world);
  for (int r = 0; r < world; r++) {
    places[r].host = text_of(records[r].host);
    places[r].visible_devices = text_of(records[r].visible_devices);
    places[r].gpu_count = records[r].gpu_count;
    places[r].no_gpu_reason = text_of(records[r].no_gpu_reason);
  }
  const int device = nccl_device_of_rank(places, rank);
  if (nccl == nullptr) fail(text_of(mine.library_problem));
  for (int r = 0; r < world; r++) {
    if (records[r].library_problem[0] != '\0')
      fail("rank ", r, " (host ", places[r].host, "): ", text_of(records[r].library_problem));
  }

  // Rank 0's unique id to every rank.
  IdRecord id{};
  if (rank == 0) {
    const ncclResult_t result = nccl->get_unique_id(&id.id);
    if (result != ncclSuccess) {
      try {
        nccl->fail_with(result, nullptr, "ncclGetUniqueId");
      } catch (const Error& e) {
        copy_text(id.problem, e.what());
      }
    }
  }
  bootstrap.broadcast(&id, sizeof(id), 0);
  if (id.problem[0] != '\0') fail(rank == 0 ? "" : "rank 0: ", text_of(id.problem));

  return std::make_unique<NcclCommunicator>(bootstrap, std::move(nccl), device, id.id);
}

namespace {

template <typename T>
void tree_sum_on_device(T* slots, int count, size_t n) {
  TANDEM_CHECK(count >= 1, "nccl_tree_sum_on_device: needs at least one part, got ", count);
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  const auto release = [&] {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  };
  try {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cublas(cublasCreate(&cublas), "cublasCreate");
    check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
    check_cublas(cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    tree_sum_slots(cublas, slots, count, n, n, "nccl_tree_sum_on_device");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (nccl_tree_sum_on_device)");
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace

void nccl_tree_sum_on_device(float* slots, int count, size_t n) {
  tree_sum_on_device(slots, count, n);
}
void nccl_tree_sum_on_device(Bf16* slots, int count, size_t n) {
  tree_sum_on_device(slots, count, n);
}

#else  // !TANDEM_HAVE_NCCL

bool nccl_available() { return false; }

int nccl_communicator_device(const Communicator&) {
  fail("nccl_communicator_device: this tandem was built without NCCL");
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&) {
  fail(
      "this tandem was built without NCCL (no CUDA toolkit with nccl.h at configure time); "
      "rebuild where the CUDA toolkit and nccl.h are installed, or run the MPI backend on the "
      "cpu device");
}

void nccl_tree_sum_on_device(float*, int, size_t) {
  fail("nccl_tree_sum_on_device: this tandem was built without NCCL");
}
void nccl_tree_sum_on_device(Bf16*, int, size_t) {
  fail("nccl_tree_sum_on_device: this tandem was built without NCCL");
}

#endif

}  // namespace tandem
