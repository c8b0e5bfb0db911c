// The communicator data parallelism is written against: the ranks of one training job and
// the collectives ZeRO needs, over host memory. Backends: in-process ranks (threads, for
// tests of many world sizes; local_group.h); MPI and NCCL to come.
//
// Determinism is part of the contract: every sum runs in rank order, ((x_0 + x_1) + x_2)
// + ..., whatever the backend and the world size, so that a result never depends on the
// library's reduction algorithm or on timing. (N ranks can then give the bits of one rank
// accumulating N micro-batches in the same order.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem {

// Bytes a rank sent and received through collectives and point-to-point calls, counted as
// a ring implementation would move them (what the ZeRO volume formulas count).
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

  // data[n] = sum over ranks of data[n], in rank order; every rank passes n.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // recv[count] = sum over ranks of send[rank() * count, (rank() + 1) * count), in rank
  // order; send holds world_size() * count floats on every rank.
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t count) = 0;
  // recv[world_size() * bytes] = every rank's send[bytes], rank r's at r * bytes.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // data[bytes] = root's data[bytes] on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point: a send is matched by the recv of the same peer pair and tag, in order.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;

  const CommunicatorTraffic& traffic() const { return traffic_; }

 protected:
  CommunicatorTraffic traffic_;
};

}  // namespace tandem
