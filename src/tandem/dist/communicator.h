// The communicator data parallelism is written against: the ranks of one training job and
// the collectives ZeRO needs, over host memory. Backends: in-process ranks (threads, for
// tests of many world sizes; local_group.h); MPI and NCCL to come.
//
// Determinism is part of the contract: every sum over ranks adds the ranks' values in one
// fixed pairwise tree (tree_sum.h: neighbours added level by level, an odd last value moved
// up unchanged; 4 ranks: (x_0 + x_1) + (x_2 + x_3)), whatever the backend, so that a result
// never depends on a library's reduction algorithm or on timing. Every backend sums through
// tree_sum. (N ranks of A micro-batches each, A a power of two, then give the bits of N' * A'
// = N * A; see tree_sum.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem {

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
  // recv[world_size() * bytes] = every rank's send[bytes], rank r's at r * bytes.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // data[bytes] = root's data[bytes] on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point: a send is matched by the recv of the same peer pair and tag, in order.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;

  // Stops every rank of the job now, after this rank failed: the others must not wait
  // for it in a collective forever. MPI: MPI_Abort (the launcher ends every process);
  // in-process ranks: every blocked and later collective of the group throws.
  virtual void abort() noexcept = 0;

  const CommunicatorTraffic& traffic() const { return traffic_; }

 protected:
  CommunicatorTraffic traffic_;
};

}  // namespace tandem
