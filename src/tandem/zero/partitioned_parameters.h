// The working parameters of ZeRO stage 3: each rank holds its partition (S elements, which
// its update engine writes), and a block's parameters are gathered from their owners just
// before the model uses the block (BlockMemory::acquire_params) into a live buffer of
// bounded size, then released.
//
// - Blocks of at most stage3_param_persistence_threshold elements are kept whole on every
//   rank (gathered once after each update, at their first use): gathering them each time
//   would cost more in latency than they weigh. (DeepSpeed applies the threshold per tensor; tandem
//   gathers whole blocks, so it applies it per block.)
// - The live buffer holds two blocks, placed at either end of it: the two largest fit side
//   by side, so the two a model may use at once always fit, whatever was placed before. A
//   released block stays there until the room is needed (the tied embeddings used at the
//   end of forward and at the start of backward are gathered once), and the room not in
//   use takes the next block early (prefetch). stage3_max_live_parameters must allow the
//   two largest blocks (a smaller value is refused); the buffer never holds more.
// - Prefetch: the order of the acquires is recorded in the first step; from then on, a
//   gather also starts fetching the block that comes next in that order, when it has at
//   most stage3_prefetch_bucket_size parameters. With a CollectiveQueue (overlap_comm) that
//   gather runs on the queue's thread while the model computes with the current block, and
//   an acquire waits only for the gather of the block it asks for; without one, gathers are
//   synchronous and prefetching only coalesces them.
// - A gather moves each owner's piece of the block by a broadcast from that owner (the
//   partitions are contiguous ranges of the flat space, shared with stages 1 and 2, so a
//   block usually has one or two owners). Every rank makes the same calls in the same
//   order: the model's order of acquires is the same on every rank, and so is every
//   decision taken here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/comm/collective_queue.h"
#include "tandem/comm/communicator.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/model/param_range.h"
#include "tandem/zero/partition.h"
#include "tandem/zero/zero_config.h"

namespace tandem {

class PartitionedParameters {
 public:
  PartitionedParameters(Communicator& comm, ComputeBackend& backend, StorageDType dtype,
                        const ZeroPartition& partition, std::vector<ParamRange> blocks,
                        const ZeroConfig& config, CollectiveQueue* queue = nullptr);

  struct Sizes {
    size_t persistent = 0;  // elements kept whole on every rank
    size_t live = 0;        // elements of the live buffer
  };
  // What a rank holds besides its partition; throws tandem::Error when
  // stage3_max_live_parameters is below the two largest blocks.
  static Sizes sizes(const std::vector<ParamRange>& blocks, const ZeroConfig& config);
  // Bytes of backend memory a rank holds: its partition, the persistent blocks, the live
  // buffer.
  static size_t bytes_needed(const std::vector<ParamRange>& blocks, const ZeroPartition& partition,
                             StorageDType dtype, const ZeroConfig& config);
  size_t allocated_bytes() const { return allocated_bytes_; }

  // This rank's working parameters, [S] from the start of its partition.
  void* partition_params() { return partition_.as<void>(); }

  const void* acquire(int block);
  void release(int block);
  // The partitions changed (an update, a load): cached gathers are stale, and so are the
  // persistent blocks, gathered again at their next acquire (which every rank makes in the
  // same order, so the gathers stay collective) rather than now, while the update may still
  // be writing the later blocks.
  void parameters_changed();
  // Called before a gather reads this rank's piece of a block (its range in the flat
  // space): an update engine still updating the partition (offload_optimizer.overlap_forward)
  // returns once that piece is final. Empty: the partition is always final.
  using PieceNeeded = std::function<void(ParamRange piece)>;
  void set_piece_needed(PieceNeeded needed) { piece_needed_ = std::move(needed); }

  // Most elements of gathered, non-persistent blocks held at once so far.
  size_t peak_live_elements() const { return peak_live_; }
  // Blocks gathered so far, and of them those fetched ahead of their acquire (prefetched).
  size_t gathered_blocks() const { return gathered_blocks_; }
  size_t prefetched_blocks() const { return prefetched_blocks_; }

 private:
  struct Resident {  // a block in the live buffer
    int block = -1;
    size_t offset = 0, size = 0;  // elements of the live buffer
    int users = 0;
    uint64_t last_used = 0;
    CollectiveQueue::Ticket gathered = 0;  // its gather, until waited for
  };
  bool persistent(int block) const;
  // Room for `size` elements at an end of the live buffer, evicting released blocks in
  // the way (of the end used least recently) when `evict`; SIZE_MAX when there is none.
  size_t find_room(size_t size, bool evict);
  // Starts gathering `block` into dst (in the live or the persistent buffer) from its
  // owners.
  CollectiveQueue::Ticket gather(int block, char* dst);
  Resident* resident(int block);
  void prefetch_after(int block);
  size_t live_elements() const;

  Communicator& comm_;
  ComputeBackend& backend_;
  StorageDType dtype_;
  size_t elem_;
  ZeroPartition partition_range_;
  std::vector<ParamRange> blocks_;
  ZeroConfig config_;
  Buffer partition_;                       // [S]
  Buffer persistent_buffer_;               // the persistent blocks, whole
  std::vector<size_t> persistent_offset_;  // per block, SIZE_MAX when not persistent
  std::vector<char> persistent_fresh_;     // per block: gathered since the last change
  Buffer live_;
  size_t live_capacity_ = 0;
  std::vector<Resident> residents_;
  uint64_t clock_ = 0;
  size_t peak_live_ = 0;
  size_t gathered_blocks_ = 0, prefetched_blocks_ = 0;
  size_t allocated_bytes_ = 0;
  // The recorded order of acquires (first step), and where the model is in it.
  std::vector<int> order_;
  bool recording_ = true;
  size_t position_ = 0;
  CollectiveQueue* queue_;
  PieceNeeded piece_needed_;
};

}  // namespace tandem
