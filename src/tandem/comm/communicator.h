// The communicator data parallelism is written against: the ranks of one training job and
// the collectives ZeRO needs, over the memory of its backend. Backends: in-process ranks (threads,
// for tests of many world sizes; local_group.h), MPI (host memory; mpi_communicator.h) and NCCL
// (device memory; nccl_communicator.h).
//
// Determinism is part of the contract: every sum over ranks adds the ranks' values in one
// fixed pairwise tree (tree_sum.h: neighbours added level by level, an odd last value moved
// up unchanged; 4 ranks: (x_0 + x_1) + (x_2 + x_3)), whatever the backend, so that a result
// never depends on a library's reduction algorithm or on timing. Every backend sums through
// tree_sum. (N ranks of A micro-batches each, A a power of two, then give the bits of N' * A'
// = N * A; see tree_sum.h.)
//
// A rank that dies or hangs does not hang the others forever. Every collective, send and
// recv waits at most timeout() (per communicator: set_timeout; by default
// TANDEM_COMM_TIMEOUT_S seconds, else 600 s) for the other ranks, and then throws
// tandem::Error naming exactly the ranks it is still waiting for:
//
//   rank 0: no data from rank(s) 2, 3 within 30 s in all_reduce_sum (dead or hung?); raise
//   TANDEM_COMM_TIMEOUT_S if a rank is only slow
//
// ("rank(s) 2 did not take this rank's data ..." when only its sends are left). The waits
// count from the start of each exchange of the call (reduce_sum: each piece), not across
// calls, so a slow but live rank only needs to make progress within the timeout. The
// caller is then expected to stop the job with abort() (tandem train does): which messages
// of the failed call arrived is not known, so a backend may refuse any later call.
#pragma once

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/half.h"

namespace tandem {

// The environment variable that sets every communicator's default timeout, in seconds.
inline constexpr const char* kCommTimeoutVariable = "TANDEM_COMM_TIMEOUT_S";
inline constexpr std::chrono::milliseconds kDefaultCommTimeout{600'000};

// A timeout a communicator accepts: positive (a wait of 0 would fail every collective).
inline void check_communicator_timeout(std::chrono::milliseconds timeout) {
  TANDEM_CHECK(timeout.count() > 0, "communicator timeout: ", timeout.count(),
               " ms is not a positive time; a collective must be allowed to wait (the default is ",
               kDefaultCommTimeout.count() / 1000, " s)");
}

// The timeout TANDEM_COMM_TIMEOUT_S=`value` asks for: a positive number of seconds
// ("30", "0.5", "1e3"), rounded to milliseconds (at least 1). Anything else is a
// tandem::Error naming the variable.
inline std::chrono::milliseconds parse_communicator_timeout(std::string_view value) {
  const std::string text(value);
  char* end = nullptr;
  const double seconds = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size() &&
                      !std::isspace(static_cast<unsigned char>(text[0])) && std::isfinite(seconds);
  TANDEM_CHECK(number, kCommTimeoutVariable, "='", text,
               "' is not a number of seconds; set it to a positive number such as 600, or unset it "
               "for the default of ",
               kDefaultCommTimeout.count() / 1000, " s");
  TANDEM_CHECK(seconds > 0, kCommTimeoutVariable, "='", text,
               "': the timeout must be positive (seconds a rank waits for the others before it "
               "names the missing ones)");
  TANDEM_CHECK(seconds <= 1e9, kCommTimeoutVariable, "='", text,
               "' is more seconds than tandem takes (1e9)");
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

// TANDEM_COMM_TIMEOUT_S if set, else kDefaultCommTimeout.
inline std::chrono::milliseconds communicator_timeout_from_environment() {
  const char* value = std::getenv(kCommTimeoutVariable);
  return value == nullptr ? kDefaultCommTimeout : parse_communicator_timeout(value);
}

// The error of a wait that timed out: `missing` are the ranks this rank still waits for,
// from which no data came (`receiving`) or which did not take this rank's data.
[[noreturn]] inline void fail_communicator_timeout(int rank, const std::vector<int>& missing,
                                                   bool receiving,
                                                   std::chrono::milliseconds timeout,
                                                   std::string_view what) {
  std::string ranks;
  for (size_t i = 0; i < missing.size(); i++) ranks += (i ? ", " : "") + std::to_string(missing[i]);
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", static_cast<double>(timeout.count()) / 1000);
  if (receiving)
    fail("rank ", rank, ": no data from rank(s) ", ranks, " within ", seconds, " s in ", what,
         " (dead or hung?); raise ", kCommTimeoutVariable, " if a rank is only slow");
  fail("rank ", rank, ": rank(s) ", ranks, " did not take this rank's data within ", seconds,
       " s in ", what, " (dead or hung?); raise ", kCommTimeoutVariable, " if a rank is only slow");
}

// Bytes a rank sent and received through collectives and point-to-point calls, counted as
// a ring implementation would move them (what the ZeRO volume formulas count), whatever the
// backend really moved. Each way, per rank, for N ranks: all-reduce of n floats
// 2 (N - 1) / N * 4n bytes; reduce-scatter to count floats (N - 1) * 4 count; reduce to a
// root of n floats (N - 1) / N * 4n; all-gather of b bytes (N - 1) b.
struct CommunicatorTraffic {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string_view backend() const = 0;

  // data[n] = tree sum over ranks of data[n]; every rank passes n.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // recv[count] = tree sum over ranks of send[rank() * count, (rank() + 1) * count); send
  // holds world_size() * count floats on every rank.
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t count) = 0;
  // On root: recv[n] = tree sum over ranks of send[n]; send may be recv there (in place).
  // The other ranks' recv is left untouched and may be null. Every rank passes n and root.
  virtual void reduce_sum(const float* send, float* recv, size_t n, int root) = 0;
  // all_reduce_sum and reduce_sum over bf16 values (half the bytes of fp32), each addition
  // of the tree done in fp32 and rounded to bf16 (comm/tree_sum.h), as one rank's bf16
  // micro-batch gradients are added: bf16 gradients then give the same bits whether their
  // micro-batches ran on one rank or on several.
  virtual void all_reduce_sum_bf16(Bf16* data, size_t n) = 0;
  virtual void reduce_sum_bf16(const Bf16* send, Bf16* recv, size_t n, int root) = 0;
  // recv[world_size() * bytes] = every rank's send[bytes], rank r's at r * bytes.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // data[bytes] = root's data[bytes] on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point: a send is matched by the recv of the same peer pair and tag, in order.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;

  // A new communicator of the same ranks whose messages never meet this one's, for another
  // thread to use at the same time as this one (a CollectiveQueue's: collective_queue.h).
  // Collective: every rank calls it, in the same order. Null when the backend cannot be
  // used from two threads at once (MPI without MPI_THREAD_MULTIPLE, NCCL); the caller then
  // keeps its collectives on one thread. Aborting either aborts both.
  virtual std::unique_ptr<Communicator> duplicate() { return nullptr; }

  // Stops every rank of the job now, after this rank failed: the others must not wait
  // for it in a collective forever. MPI: MPI_Abort (the launcher ends every process);
  // in-process ranks: every blocked and later collective of the group throws.
  virtual void abort() noexcept = 0;

  // How long any one wait of a collective, send or recv may last before it throws naming
  // the ranks it waits for (see above). Positive; refused otherwise. Each rank sets its own.
  virtual void set_timeout(std::chrono::milliseconds timeout) {
    check_communicator_timeout(timeout);
    timeout_ = timeout;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

  const CommunicatorTraffic& traffic() const { return traffic_; }

 protected:
  CommunicatorTraffic traffic_;
  // From the environment when the communicator is made (a malformed value throws there).
  std::chrono::milliseconds timeout_ = communicator_timeout_from_environment();
};

}  // namespace tandem
