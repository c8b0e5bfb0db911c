// Sums the gradients of a step's micro-batches in the pairwise-tree order of
// comm/tree_sum.h, the order the communicators sum ranks in. Each micro-batch's backward
// writes its gradients into zeroed buffers; they are then added as a tree, so that
// N ranks x A micro-batches and N' x A' with the same global batch give the same bits
// (A, A' powers of two, or one rank).
//
// Streaming form of the tree (a binary counter): a finished micro-batch is added to the
// top of a stack of partial sums while the top has the same level, then pushed; the
// last micro-batch's gradients are then added to the stack from the top down. That last
// part works on any range of the buffer, so it runs during the last backward as blocks
// finish (Model::GradientsReady), letting reduction and offload start early.
//
// A = 1 needs no memory and does nothing; A > 1 keeps up to ceil(log2 A) buffers of
// the gradient size in the backend's memory.
#pragma once

#include <cstddef>
#include <vector>

#include "tandem/compute/compute_backend.h"

namespace tandem {

class GradientAccumulator {
 public:
  // For n gradients of `dtype` and `micro_batches` micro-batches per step; allocates
  // every buffer it will need now.
  GradientAccumulator(ComputeBackend& backend, StorageDType dtype, size_t n, int micro_batches);

  // Partial-sum buffers (of n elements each) kept for `micro_batches` per step.
  static size_t buffers_needed(int micro_batches);

  int micro_batches() const { return micro_batches_; }
  // Bytes of backend memory held for partial sums.
  size_t allocated_bytes() const;

  // `grads` holds the gradients of one micro-batch that is not the step's last: folds
  // them into the partial sums. The caller zeroes `grads` before the next backward.
  void add(const void* grads);
  // `grads` holds the last micro-batch's gradients over [begin, end) (the rest may still
  // be in progress): makes grads[begin, end) the tree sum of all the step's micro-batches.
  // Call it once per range of the step (ranges must not overlap), then start_step().
  void finish(void* grads, size_t begin, size_t end);
  // Forgets the partial sums: the next add() is the first micro-batch of a step.
  void start_step();

 private:
  struct Partial {
    size_t buffer = 0;  // index into buffers_
    int level = 0;      // it sums 2^level micro-batches
  };
  void add_into(void* dst, const void* a, const void* b, size_t begin, size_t end);
  char* at(const void* base, size_t index) const;

  ComputeBackend& backend_;
  StorageDType dtype_;
  size_t n_;
  int micro_batches_;
  std::vector<Buffer> buffers_;
  std::vector<Partial> stack_;
  std::vector<size_t> free_;  // indices of buffers not on the stack
};

}  // namespace tandem
