// The gradient memory of ZeRO stages 2 and 3: no rank holds the whole gradient.
//
// Backward adds a block's gradients of one micro-batch into a slot (BlockMemory); once the
// block is released the slot is reduced over the ranks, each partition's piece summed into
// its owner's buffer of S elements (zero/partition.h), and the slot is free again. With
// several micro-batches per step, every micro-batch is reduced this way (the slots cannot
// hold a rank's sum of its micro-batches), and each owner adds the step's reduced
// micro-batches in the communicators' tree order (dist/gradient_accumulator.h over the
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
// Memory: the slots (the largest block, for the embeddings held through backward, and the
// largest other one), S elements of reduced gradients, and ceil(log2 A) more partials of S
// elements when A > 1.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/dist/communicator.h"
#include "tandem/dist/gradient_accumulator.h"
#include "tandem/model/param_range.h"
#include "tandem/zero/partition.h"

namespace tandem {

class PartitionedGradients {
 public:
  // blocks: the model's blocks (Gpt::blocks()); pieces of at most reduce_bucket_size
  // elements are reduced at a time.
  PartitionedGradients(Communicator& comm, ComputeBackend& backend, StorageDType dtype,
                       const ZeroPartition& partition, std::vector<ParamRange> blocks,
                       int micro_batches, size_t reduce_bucket_size);

  // Bytes of backend memory a rank holds for this (what the constructor allocates).
  static size_t bytes_needed(const std::vector<ParamRange>& blocks, const ZeroPartition& partition,
                             StorageDType dtype, int micro_batches);
  // Of which the slots (not counted in ZeRO's model states).
  static size_t slot_bytes(const std::vector<ParamRange>& blocks, StorageDType dtype);
  size_t allocated_bytes() const { return allocated_bytes_; }

  // The next backward pass is micro-batch `micro` of the step (0-based); the last one makes
  // the partition's gradients final.
  void start_micro_batch(int micro);
  void* acquire(int block);
  // Reduces the block's gradients over the ranks now (a collective).
  void release(int block);
  // After a micro-batch's backward (every block released): a micro-batch that is not the
  // step's last is folded into the partials.
  void finish_micro_batch();

  // This rank's reduced gradients, [S] from the start of its partition: final on a range once
  // the step's last micro-batch has released the blocks that cover it.
  void* partition_grads() { return reduced_.as<void>(); }
  const void* partition_grads() const { return reduced_.as<void>(); }

 private:
  struct Slot {
    Buffer buffer;
    size_t capacity = 0;  // elements
    int block = -1;       // the block using it, -1 when free
  };
  void reduce_piece(const char* slot, size_t begin, size_t end);

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
};

}  // namespace tandem
