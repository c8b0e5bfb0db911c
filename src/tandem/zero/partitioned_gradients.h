// The gradient memory of ZeRO stages 2 and 3: no rank holds the whole gradient.
//
// Backward adds a block's gradients of one micro-batch into a slot (BlockMemory); once the
// block is released the slot is reduced over the ranks, each partition's piece summed into
// its owner's buffer of S elements (zero/partition.h), and the slot is free again. With
// several micro-batches per step, every micro-batch is reduced this way (the slots cannot
// hold a rank's sum of its micro-batches), and each owner adds the step's reduced
// micro-batches in the communicators' tree order (zero/gradient_accumulator.h over the
// partition).
//
// The sum this gives: for each micro-batch a, the tree over the ranks, then the tree over
// a. The trainer gives rank r the micro-batches a N + r of the global batch (micro-major),
// so with N a power of two that is the tree over the whole global batch, as one rank
// accumulating N A micro-batches (or stages 0 and 1, which sum each rank's micro-batches
// first and give rank r the micro-batches r A + a; the same tree when A is a power of two
// or 1). When N is not a power of two and A > 1 the two orders round differently (no
// single tree has both the ranks' and the micro-batches' groups as subtrees).
//
// With a CollectiveQueue (overlap_comm) the reductions run on the queue's thread while
// backward computes the next blocks, and a slot is reused only once its reduction is done:
// a third slot (of the second-largest block's size) lets one block be reduced while the next
// is computed even though backward holds the embeddings' slot throughout. What the owner does with
// a reduced piece (adding the step's earlier micro-batches) runs on the training thread, in order,
// as pieces finish (complete_reductions).
//
// Memory: the slots (the largest block, for the embeddings held through backward, and the
// largest other one, twice with overlap), S elements of reduced gradients, and ceil(log2 A) more
// partials of S elements when A > 1.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include "tandem/comm/collective_queue.h"
#include "tandem/comm/communicator.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/model/param_range.h"
#include "tandem/zero/gradient_accumulator.h"
#include "tandem/zero/partition.h"

namespace tandem {

class PartitionedGradients {
 public:
  // blocks: the model's blocks (Model::blocks()); pieces of at most reduce_bucket_size
  // elements are reduced at a time.
  // With `queue`, the reductions run there (on `comm`, which only the queue's thread then
  // uses); without, in release().
  PartitionedGradients(Communicator& comm, ComputeBackend& backend, StorageDType dtype,
                       const ZeroPartition& partition, std::vector<ParamRange> blocks,
                       int micro_batches, size_t reduce_bucket_size,
                       CollectiveQueue* queue = nullptr);

  // Bytes of backend memory a rank holds for this (what the constructor allocates; with a
  // queue when `overlap`).
  static size_t bytes_needed(const std::vector<ParamRange>& blocks, const ZeroPartition& partition,
                             StorageDType dtype, int micro_batches, bool overlap);
  // Of which the slots (not counted in ZeRO's model states).
  static size_t slot_bytes(const std::vector<ParamRange>& blocks, StorageDType dtype, bool overlap);
  size_t allocated_bytes() const { return allocated_bytes_; }

  // The next backward pass is micro-batch `micro` of the step (0-based); the last one makes
  // the partition's gradients final.
  void start_micro_batch(int micro);
  // A slot for the block, zeroed (waiting for the reduction that last used it).
  void* acquire(int block);
  // Starts reducing the block's gradients over the ranks (a collective; done before it
  // returns without a queue).
  void release(int block);
  // Finishes the reductions that are done (all of them when `wait`): pieces of the step's
  // last micro-batch are then final in partition_grads().
  void complete_reductions(bool wait);
  // Whether a reduction of [begin, end) (flat indices) was started and is not yet complete.
  bool reducing(size_t begin, size_t end) const;
  // After a micro-batch's backward (every block released): waits for its reductions; a
  // micro-batch that is not the step's last is folded into the partials.
  void finish_micro_batch();

  // This rank's reduced gradients, [S] from the start of its partition: final on a range once
  // the step's last micro-batch has released the blocks that cover it.
  void* partition_grads() { return reduced_.as<void>(); }
  const void* partition_grads() const { return reduced_.as<void>(); }

 private:
  struct Slot {
    Buffer buffer;
    size_t capacity = 0;                    // elements
    int block = -1;                         // the block using it, -1 when free
    CollectiveQueue::Ticket reduction = 0;  // the last reduction reading it
  };
  // A piece whose reduction was started: flat [begin, end), to owner.
  struct Reduction {
    CollectiveQueue::Ticket ticket = 0;
    size_t begin = 0, end = 0;
    bool final_here = false;  // this rank owns it and it is the step's last micro-batch
  };
  CollectiveQueue::Ticket reduce_piece(const char* slot, size_t begin, size_t end);

  Communicator& comm_;
  ComputeBackend& backend_;
  StorageDType dtype_;
  ZeroPartition partition_;
  std::vector<ParamRange> blocks_;
  size_t reduce_bucket_size_;
  int micro_batches_;
  int micro_ = 0;
  std::vector<Slot> slots_;
  Buffer reduced_;  // [S]
  GradientAccumulator accumulator_;
  size_t allocated_bytes_ = 0;
  CollectiveQueue* queue_;
  std::deque<Reduction> reductions_;  // started, not completed; in order
};

}  // namespace tandem
