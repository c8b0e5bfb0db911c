// Data parallelism with ZeRO stages 0-2 (zero_config.h) over a Communicator: what a rank
// does with its gradients after backward and with its working parameters after its
// update. Model-agnostic: it sees the flat gradient and working-parameter buffers and the
// ranges the model announces as final; nothing here knows about GPT.
//
//   stage 0: each announced range is all-reduced; every rank's optimizer updates all.
//   stage 1: after backward, the gradients are reduced to the rank owning them (a
//            reduce-scatter: each rank needs its partition's only); each rank's optimizer
//            holds and updates its partition, and the new working parameters are
//            all-gathered after the update.
//   stage 2: as stage 1, but each range is reduced as the model announces it during
//            backward (overlap_comm). The model still keeps a full gradient buffer: the
//            gradient memory is not partitioned yet.
// Ranges are reduced in buckets of reduce_bucket_size elements. Per step and rank that
// moves about 2P elements at every stage (ring all-reduce; reduce-scatter + all-gather),
// counted in Communicator::traffic(). The sums run in
// the communicator's fixed tree order (dist/tree_sum.h), so every stage gives the same
// bits, and so do N ranks and one rank accumulating N micro-batches.
//
// Two communicators of the same ranks: `host` for the small host-side exchanges (losses,
// norm block sums, the fp32 state gathered for a checkpoint) and `buffers` for the model's
// gradient and parameter buffers, in the backend's memory: the same MPI or in-process
// communicator on the cpu device, NCCL on the cuda device. bf16 gradients are summed as bf16,
// every addition of the tree rounded to bf16, as one rank adds its micro-batches: bf16 runs
// too give the same bits for any split of the global batch.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/dist/communicator.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/zero/partition.h"
#include "tandem/zero/zero_config.h"

namespace tandem {

class DataParallel {
 public:
  struct ModelBuffers {
    ComputeBackend* backend = nullptr;  // whose memory the buffers are in
    void* grads = nullptr;              // [num_params] of grad_dtype
    StorageDType grad_dtype = StorageDType::kF32;
    // [num_params] of working_dtype, in a buffer of at least partition().padded_size()
    // elements from stage 1 (the ranks' partitions are all-gathered into it in place).
    void* working_params = nullptr;
    StorageDType working_dtype = StorageDType::kF32;
    size_t num_params = 0;
  };

  DataParallel(Communicator& host, Communicator& buffers, const ZeroConfig& config,
               ModelBuffers model);

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }
  const ZeroConfig& config() const { return config_; }
  const ZeroPartition& partition() const { return partition_; }
  Communicator& communicator() { return comm_; }
  // Elements the working-parameter buffer must hold: the padded flat space from stage 1.
  static size_t working_params_capacity(size_t num_params, int world_size, int stage);
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
  // replaced by their owners' (stage >= 1): one all-gather in place in the padded buffer,
  // no staging memory.
  void gather_working_params();
  // data[num_params] (host memory) of elem_bytes elements is valid on state_range(); fills
  // the rest from the other ranks (a no-op at stage 0), in buckets of
  // allgather_bucket_size: the fp32 state of a checkpoint.
  void gather_partitions(void* data, size_t elem_bytes);

  // The mean loss of the global batch from this rank's micro-batch losses (in order): the
  // losses of all ranks summed in double in the order of the global batch (rank-major),
  // as one rank accumulating all of its micro-batches would.
  float global_mean_loss(const std::vector<float>& micro_losses);

 private:
  void reduce(size_t begin, size_t end, const Reduced& reduced);
  void reduce_piece(size_t begin, size_t end, int owner);

  Communicator& comm_;         // host exchanges
  Communicator& buffer_comm_;  // the model's buffers
  ZeroConfig config_;
  ModelBuffers buffers_;
  ZeroPartition partition_;
  std::vector<ParamRange> pending_;  // announced, not yet reduced
  size_t pending_elements_ = 0;
  size_t announced_ = 0;  // elements announced this step
};

}  // namespace tandem
