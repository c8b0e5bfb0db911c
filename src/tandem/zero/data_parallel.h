// Data parallelism with ZeRO stages 0-3 (zero_config.h) over a Communicator: what a rank
// does with its gradients during and after backward, and with its working parameters
// after its update. Model-agnostic: it sees the flat buffers, the model's blocks (ranges
// of the flat space) and the ranges the model announces as final; nothing here knows
// about GPT.
//
//   stage 0: each announced range is all-reduced; every rank's optimizer updates all.
//   stage 1: after backward, the gradients are reduced to the rank owning them (a
//            reduce-scatter: each rank needs its partition's only); each rank's optimizer
//            holds and updates its partition, and the new working parameters are
//            all-gathered after the update.
//   stage 2: the gradients are partitioned too: the model holds no gradient buffer but
//            gets this object as its BlockMemory, whose slots are reduced to their owners
//            as each block's backward completes (partitioned_gradients.h), every
//            micro-batch. Working parameters as at stage 1.
//   stage 3: the parameters are partitioned too: a block's are gathered from their owners
//            just before the model uses it and released after (partitioned_parameters.h);
//            the update engine writes this rank's partition only.
// Stages 0 and 1 reduce ranges in buckets of reduce_bucket_size elements. Per step and rank
// that moves about 2P elements at stages 0-2 (ring all-reduce; reduce-scatter + all-gather)
// and about 3P at stage 3 (a reduce and two gathers: forward and backward), counted in
// Communicator::traffic(). The sums run in the communicator's fixed tree order
// (comm/tree_sum.h), so every stage gives the same bits (with several micro-batches per
// step: when their number and the world size are powers of two; see
// partitioned_gradients.h), and so do N ranks and one rank accumulating N micro-batches.
//
// overlap_comm (with world size > 1 and a buffer communicator that is not the host one,
// such as Communicator::duplicate's): the collectives on the model's buffers run on a
// CollectiveQueue's thread while the training thread computes (comm/collective_queue.h):
// stages 0 and 1 reduce gradient buckets as soon as they are final during backward, stages
// 2 and 3 reduce each block while backward computes the next, and stage 3 gathers the next
// block's parameters while the model uses the current one. The training thread waits only
// where it needs a result; the bits do not change. Off: every collective runs where it is
// called, and stage 1 reduces after backward.
//
// Two communicators of the same ranks: `host` for the small host-side exchanges (losses,
// norm block sums, the fp32 state gathered for a checkpoint) and `buffers` for the model's
// gradient and parameter buffers, in the backend's memory: the same MPI or in-process
// communicator on the cpu device, NCCL on the cuda device. bf16 gradients are summed as bf16,
// every addition of the tree rounded to bf16, as one rank adds its micro-batches: bf16 runs
// too give the same bits for any split of the global batch.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "tandem/comm/collective_queue.h"
#include "tandem/comm/communicator.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/model/block_memory.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/zero/partition.h"
#include "tandem/zero/partitioned_gradients.h"
#include "tandem/zero/partitioned_parameters.h"
#include "tandem/zero/zero_config.h"

namespace tandem {

class DataParallel final : public BlockMemory {
 public:
  struct ModelBuffers {
    ComputeBackend* backend = nullptr;  // whose memory the buffers are in
    void* grads = nullptr;              // [num_params] of grad_dtype; none from stage 2
    StorageDType grad_dtype = StorageDType::kF32;
    // [num_params] of working_dtype, in a buffer of at least partition().padded_size()
    // elements at stages 1 and 2 (the ranks' partitions are all-gathered into it in
    // place); none at stage 3.
    void* working_params = nullptr;
    StorageDType working_dtype = StorageDType::kF32;
    size_t num_params = 0;
    std::vector<ParamRange> blocks;  // the model's blocks (stages 2 and 3)
    int micro_batches = 1;           // per step, on this rank
  };

  DataParallel(Communicator& host, Communicator& buffers, const ZeroConfig& config,
               ModelBuffers model);

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }
  const ZeroConfig& config() const { return config_; }
  const ZeroPartition& partition() const { return partition_; }
  Communicator& communicator() { return comm_; }
  // Elements the model's working-parameter buffer must hold: the padded flat space at
  // stages 1 and 2, none at stage 3.
  static size_t working_params_capacity(size_t num_params, int world_size, int stage);
  // Whether the model keeps a flat buffer of all its gradients (stages 0 and 1).
  static bool model_holds_gradients(int stage) { return stage < 2; }
  // Backend bytes this object holds at stages 2 and 3 (partitioned gradients and
  // parameters), none below.
  static size_t partitioned_bytes(const std::vector<ParamRange>& blocks, size_t num_params,
                                  int world_size, const ZeroConfig& config, StorageDType dtype,
                                  int micro_batches);

  // The model's memory from stage 2 (this object), null below.
  BlockMemory* block_memory() { return config_.stage >= 2 ? this : nullptr; }
  // Where the update engine reads gradients and writes working parameters: a buffer and
  // the flat index of its first element (a partition's start from stage 2, resp. 3).
  const void* engine_grads() const;
  size_t engine_grads_begin() const;
  void* engine_working_params();
  ParamRange engine_working_range() const;

  // The step's micro-batch `micro` (0-based) starts its backward pass; and has finished
  // it. From stage 2 the reduction runs per micro-batch.
  void start_micro_batch(int micro);
  void finish_micro_batch();
  // The working parameters were loaded (stage 3: the persistent blocks are gathered).
  void parameters_loaded();

  // BlockMemory, from stage 2.
  const void* acquire_params(int block) override;
  void release_params(int block) override;
  void* acquire_grads(int block) override;
  void release_grads(int block) override;
  // The parameters whose optimizer state this rank holds and updates: all of them at
  // stage 0, this rank's partition from stage 1.
  ParamRange state_range() const;

  // Told of ranges whose reduced gradients this rank now holds, within state_range().
  using Reduced = std::function<void(size_t begin, size_t end)>;
  // This rank's gradients [begin, end) of the step are final (its micro-batches summed).
  // With overlap_comm, full buckets are reduced now.
  void gradients_final(size_t begin, size_t end, const Reduced& reduced);
  // Reduces what is left of the step's gradients (all of them when no range was
  // announced), then starts a new step.
  void finish_reduction(const Reduced& reduced);

  // The sum of squares of the reduced gradients, the same bits at every stage and world
  // size: `whole_buffer` computes it over the full gradient buffer where every rank has
  // it (stage 0); from stage 1 the partitions' block partials are gathered.
  double grad_sum_of_squares(const std::function<double()>& whole_buffer);

  // After the update: every rank's working parameters outside its state_range() are
  // replaced by their owners' (stages 1 and 2): one all-gather in place in the padded
  // buffer, no staging memory. Stage 3 gathers blocks as they are used: here only the
  // persistent ones.
  void gather_working_params();
  // Whether gather_working_params() reads the engine's working parameters at once (stages 1
  // and 2 on more than one rank; stage 3 gathers each block as the model acquires it).
  bool gathers_working_params() const;
  // Stage 3: called before a gather reads this rank's piece of a block
  // (PartitionedParameters::set_piece_needed); nothing below it.
  void set_piece_needed(PartitionedParameters::PieceNeeded needed);
  // Stage 3: the most gathered parameters held at once so far (bounded by
  // stage3_max_live_parameters); 0 below.
  size_t peak_live_parameters() const { return params_ ? params_->peak_live_elements() : 0; }
  // data[num_params] (host memory) of elem_bytes elements is valid on state_range(); fills
  // the rest from the other ranks (a no-op at stage 0), in buckets of
  // allgather_bucket_size: the fp32 state of a checkpoint.
  void gather_partitions(void* data, size_t elem_bytes);

  // Whether collectives on the model's buffers overlap compute (overlap_comm, see above).
  bool overlaps_communication() const { return queue_ != nullptr; }
  // Whether they will, given a buffer communicator of its own (what memory is planned for).
  static bool overlaps_communication(const ZeroConfig& config, int world_size) {
    return config.overlap_comm && world_size > 1;
  }
  // Seconds the collectives on the model's buffers ran on their own thread, and seconds the
  // training thread waited for them, since the start (0 without overlap).
  double collective_seconds() const { return queue_ ? queue_->busy_seconds() : 0.0; }
  double collective_wait_seconds() const { return queue_ ? queue_->waited_seconds() : 0.0; }

  // The mean loss of the global batch from this rank's micro-batch losses (in order): the
  // losses of all ranks summed in double in the order of the global batch, as one rank
  // accumulating all of its micro-batches would. Rank r's micro-batch a is r A + a of the
  // global batch, or a N + r when `micro_major` (stages 2 and 3).
  float global_mean_loss(const std::vector<float>& micro_losses, bool micro_major);

 private:
  // Starts reducing [begin, end) in buckets (stages 0 and 1); this rank's parts are handed
  // on by hand_on once reduced.
  void reduce(size_t begin, size_t end);
  CollectiveQueue::Ticket reduce_piece(size_t begin, size_t end, int owner);
  // Hands on, in order, the ranges of this rank whose reduction is complete; all of them,
  // waiting, when `wait`.
  void hand_on(const Reduced& reduced, bool wait);
  // Runs a collective on the model's buffers (on the queue when there is one) and waits.
  void buffer_collective(std::function<void()> work);

  Communicator& comm_;         // host exchanges
  Communicator& buffer_comm_;  // the model's buffers
  ZeroConfig config_;
  ModelBuffers buffers_;
  ZeroPartition partition_;
  std::unique_ptr<PartitionedGradients> grads_;    // stages 2 and 3
  std::unique_ptr<PartitionedParameters> params_;  // stage 3
  std::vector<ParamRange> pending_;                // announced, not yet reduced
  size_t pending_elements_ = 0;
  size_t announced_ = 0;  // elements announced this step
  // This rank's ranges being reduced, in order (stages 0-1: by their reduction; 2-3: by
  // the gradient slots' reductions, PartitionedGradients::reducing).
  struct Handoff {
    CollectiveQueue::Ticket ticket = 0;
    ParamRange range;
  };
  std::deque<Handoff> handoff_;
  // Last: destroyed first, so that a collective still running finishes while the buffers it
  // uses exist.
  std::unique_ptr<CollectiveQueue> queue_;
};

}  // namespace tandem
