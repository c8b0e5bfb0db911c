// In-process ranks: world_size communicators that share one address space, one per thread,
// so that unit tests cover many world sizes (and odd ones) in milliseconds. The collectives
// follow the Communicator contract exactly (tree-order sums, tree_sum.h), through memory:
// each rank publishes its buffer, all wait at a barrier, each reads what it needs, and all
// wait again before any buffer may change. A wait ends after the communicator's timeout
// (communicator.h) with an error naming the ranks that had not arrived (and takes back
// this rank's arrival); run_local_ranks then aborts the group.
//
//   run_local_ranks(4, [](Communicator& comm) { ... });   // 4 threads, ranks 0..3
#pragma once

#include <functional>
#include <memory>

#include "tandem/comm/communicator.h"

namespace tandem {

class LocalGroup {
 public:
  explicit LocalGroup(int world_size);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int world_size() const;
  // Rank `rank`'s communicator; each must be used by one thread, all of them at once.
  std::unique_ptr<Communicator> communicator(int rank);
  // Makes every blocked and later collective or recv throw (a rank failed).
  void abort();

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
};

// Runs fn on world_size threads, each with its rank's communicator, and returns when all
// are done. If a rank throws, the group is aborted (ranks blocked in a collective throw
// too) and the first exception is rethrown here.
void run_local_ranks(int world_size, const std::function<void(Communicator&)>& fn);

}  // namespace tandem
