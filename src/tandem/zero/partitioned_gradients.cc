#include "tandem/zero/partitioned_gradients.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/half.h"

namespace tandem {

namespace {

// Elements of each gradient slot: the largest block, the largest other, and with overlap
// another of that size.
std::vector<size_t> slot_capacities(const std::vector<ParamRange>& blocks, bool overlap) {
  const auto [largest, second] = two_largest_blocks(blocks);
  std::vector<size_t> capacities;
  for (size_t capacity : {largest, second, overlap ? second : 0})
    if (capacity > 0) capacities.push_back(capacity);
  return capacities;
}

}  // namespace

size_t PartitionedGradients::slot_bytes(const std::vector<ParamRange>& blocks, StorageDType dtype,
                                        bool overlap) {
  size_t elements = 0;
  for (size_t capacity : slot_capacities(blocks, overlap)) elements += capacity;
  return elements * storage_dtype_bytes(dtype);
}

size_t PartitionedGradients::bytes_needed(const std::vector<ParamRange>& blocks,
                                          const ZeroPartition& partition, StorageDType dtype,
                                          int micro_batches, bool overlap) {
  return slot_bytes(blocks, dtype, overlap) +
         (1 + GradientAccumulator::buffers_needed(micro_batches)) * partition.partition_size() *
             storage_dtype_bytes(dtype);
}

PartitionedGradients::PartitionedGradients(Communicator& comm, ComputeBackend& backend,
                                           StorageDType dtype, const ZeroPartition& partition,
                                           std::vector<ParamRange> blocks, int micro_batches,
                                           size_t reduce_bucket_size, CollectiveQueue* queue)
    : comm_(comm),
      backend_(backend),
      dtype_(dtype),
      partition_(partition),
      blocks_(std::move(blocks)),
      reduce_bucket_size_(reduce_bucket_size),
      micro_batches_(micro_batches),
      accumulator_(backend, dtype, partition.partition_size(), micro_batches),
      queue_(queue) {
  TANDEM_CHECK(reduce_bucket_size >= 1, "zero_optimization.reduce_bucket_size must be at least 1");
  const size_t elem = storage_dtype_bytes(dtype_);
  for (size_t capacity : slot_capacities(blocks_, queue_ != nullptr))
    slots_.push_back({backend_.allocate(capacity * elem), capacity, -1});
  reduced_ = backend_.allocate(partition_.partition_size() * elem);
  // The padding past the last parameter is never reduced into: it stays zero.
  backend_.fill_zero(reduced_.as<void>(), partition_.partition_size() * elem);
  const bool overlap = queue_ != nullptr;
  allocated_bytes_ = bytes_needed(blocks_, partition_, dtype_, micro_batches_, overlap);
  TANDEM_CHECK(accumulator_.allocated_bytes() + slot_bytes(blocks_, dtype_, overlap) +
                       partition_.partition_size() * elem ==
                   allocated_bytes_,
               "PartitionedGradients: bytes_needed disagrees with what was allocated");
}

void PartitionedGradients::start_micro_batch(int micro) {
  TANDEM_CHECK(micro >= 0 && micro < micro_batches_, "micro-batch ", micro, " of a step of ",
               micro_batches_);
  if (micro == 0) accumulator_.start_step();
  micro_ = micro;
}

void* PartitionedGradients::acquire(int block) {
  TANDEM_CHECK(block >= 0 && static_cast<size_t>(block) < blocks_.size(), "block ", block,
               " is not one of the model's ", blocks_.size());
  const size_t n = blocks_[block].size();
  int in_use = 0;
  for (const Slot& slot : slots_) {
    TANDEM_CHECK(slot.block != block, "the gradients of block ", block, " are already acquired");
    in_use += slot.block >= 0;
  }
  TANDEM_CHECK(in_use < 2, "no free gradient slot for block ", block,
               ": a model may hold at most two blocks' gradients at once, the largest first");
  // The smallest free slot that fits, among those whose reduction is done if there are any,
  // else the one whose reduction was started first.
  Slot* best = nullptr;
  auto ready = [&](const Slot& slot) {
    return slot.reduction == 0 || queue_ == nullptr || queue_->done(slot.reduction);
  };
  for (Slot& slot : slots_) {
    if (slot.block >= 0 || slot.capacity < n) continue;
    if (best == nullptr || (ready(slot) && !ready(*best)) ||
        (ready(slot) == ready(*best) &&
         (ready(slot) ? slot.capacity < best->capacity : slot.reduction < best->reduction)))
      best = &slot;
  }
  TANDEM_CHECK(best != nullptr, "no free gradient slot for block ", block,
               ": a model may hold at most two blocks' gradients at once, the largest first");
  if (best->reduction != 0) {  // still read by a reduction of an earlier block
    wait_collective(queue_, best->reduction);
    best->reduction = 0;
    complete_reductions(false);
  }
  best->block = block;
  backend_.fill_zero(best->buffer.as<void>(), n * storage_dtype_bytes(dtype_));
  return best->buffer.as<void>();
}

void PartitionedGradients::release(int block) {
  auto slot =
      std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.block == block; });
  TANDEM_CHECK(slot != slots_.end(), "release of block ", block, "'s gradients, never acquired");
  // The block's kernels were only queued: they must be done before the communicator (the
  // host, or NCCL's stream) reads the slot.
  backend_.synchronize();
  const ParamRange range = blocks_[block];
  const char* data = slot->buffer.as<const char>();
  for (size_t b = range.begin; b < range.end;) {
    // A piece goes to one owner.
    const int owner = partition_.owner(b);
    const size_t e = std::min({range.end, partition_.range(owner).end, b + reduce_bucket_size_});
    slot->reduction = reduce_piece(data + (b - range.begin) * storage_dtype_bytes(dtype_), b, e);
    b = e;
  }
  slot->block = -1;
  if (queue_ == nullptr) complete_reductions(true);
}

CollectiveQueue::Ticket PartitionedGradients::reduce_piece(const char* slot, size_t begin,
                                                           size_t end) {
  const int owner = partition_.owner(begin);
  const bool mine = owner == comm_.rank();
  const size_t local = begin - partition_.range(owner).begin, n = end - begin;
  char* reduced = mine ? reduced_.as<char>() + local * storage_dtype_bytes(dtype_) : nullptr;
  const bool bf16 = dtype_ != StorageDType::kF32;
  Communicator& comm = comm_;
  const CollectiveQueue::Ticket ticket =
      run_collective(queue_, [&comm, slot, reduced, n, owner, bf16] {
        if (!bf16) {
          comm.reduce_sum(reinterpret_cast<const float*>(slot), reinterpret_cast<float*>(reduced),
                          n, owner);
        } else {
          // Summed as bf16, every addition rounded, as a rank adds bf16 micro-batches.
          comm.reduce_sum_bf16(reinterpret_cast<const Bf16*>(slot),
                               reinterpret_cast<Bf16*>(reduced), n, owner);
        }
      });
  reductions_.push_back({ticket, begin, end, mine && micro_ + 1 == micro_batches_});
  return ticket;
}

void PartitionedGradients::complete_reductions(bool wait) {
  while (!reductions_.empty()) {
    const Reduction piece = reductions_.front();
    if (!wait && queue_ != nullptr && !queue_->done(piece.ticket)) return;
    wait_collective(queue_, piece.ticket);  // rethrows a failed reduction
    reductions_.pop_front();
    if (piece.final_here) {
      const size_t local = piece.begin - partition_.range(comm_.rank()).begin;
      accumulator_.finish(reduced_.as<void>(), local, local + (piece.end - piece.begin));
    }
  }
}

bool PartitionedGradients::reducing(size_t begin, size_t end) const {
  return std::any_of(reductions_.begin(), reductions_.end(),
                     [&](const Reduction& r) { return r.begin < end && begin < r.end; });
}

void PartitionedGradients::finish_micro_batch() {
  complete_reductions(true);
  for (Slot& slot : slots_) slot.reduction = 0;
  for (const Slot& slot : slots_)
    TANDEM_CHECK(slot.block < 0, "block ", slot.block, "'s gradients were never released");
  if (micro_ + 1 < micro_batches_) accumulator_.add(reduced_.as<void>());
}

}  // namespace tandem
