#include "tandem/zero/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "tandem/compute/cpu/sum_of_squares.h"
#include "tandem/core/error.h"
#include "tandem/core/half.h"

namespace tandem {

static_assert(ZeroPartition::kPartitionAlignment % kSumOfSquaresBlock == 0,
              "a partition must hold whole blocks of the gradient-norm sum");

DataParallel::DataParallel(Communicator& host, Communicator& buffers, const ZeroConfig& config,
                           ModelBuffers model)
    : comm_(host),
      buffer_comm_(buffers),
      config_(config),
      buffers_(model),
      partition_(model.num_params, host.world_size()) {
  TANDEM_CHECK(buffers.world_size() == host.world_size() && buffers.rank() == host.rank(),
               "DataParallel: the buffer communicator is rank ", buffers.rank(), " of ",
               buffers.world_size(), ", the host one rank ", host.rank(), " of ",
               host.world_size());
  TANDEM_CHECK(config_.stage >= 0 && config_.stage <= 3, "zero_optimization.stage ", config_.stage,
               " is not supported; use 0, 1, 2 or 3");
  TANDEM_CHECK(config_.reduce_bucket_size >= 1 && config_.allgather_bucket_size >= 1,
               "zero_optimization bucket sizes must be at least 1 element");
  TANDEM_CHECK(buffers_.backend != nullptr, "DataParallel: the model's backend is missing");
  // One thread per communicator at a time: the queue's thread may only take the buffer
  // communicator if the training thread never uses it for its own exchanges.
  if (overlaps_communication(config_, world_size()) && &buffer_comm_ != &comm_)
    queue_ = std::make_unique<CollectiveQueue>();
  if (config_.stage >= 2) {
    TANDEM_CHECK(!buffers_.blocks.empty(), "DataParallel: stage ", config_.stage,
                 " needs the model's blocks");
    grads_ = std::make_unique<PartitionedGradients>(
        buffer_comm_, *buffers_.backend, buffers_.grad_dtype, partition_, buffers_.blocks,
        buffers_.micro_batches, config_.reduce_bucket_size, queue_.get());
  }
  if (config_.stage == 3) {
    TANDEM_CHECK(buffers_.working_dtype == buffers_.grad_dtype,
                 "DataParallel: working parameters and gradients of one storage type");
    params_ = std::make_unique<PartitionedParameters>(buffer_comm_, *buffers_.backend,
                                                      buffers_.working_dtype, partition_,
                                                      buffers_.blocks, config_, queue_.get());
  }
}

size_t DataParallel::working_params_capacity(size_t num_params, int world_size, int stage) {
  if (stage == 3) return 0;
  if (stage == 0 || world_size == 1) return num_params;
  return ZeroPartition(num_params, world_size).padded_size();
}

size_t DataParallel::partitioned_bytes(const std::vector<ParamRange>& blocks, size_t num_params,
                                       int world_size, const ZeroConfig& config, StorageDType dtype,
                                       int micro_batches) {
  const ZeroPartition partition(num_params, world_size);
  size_t bytes = 0;
  if (config.stage >= 2)
    bytes += PartitionedGradients::bytes_needed(blocks, partition, dtype, micro_batches,
                                                overlaps_communication(config, world_size));
  if (config.stage == 3)
    bytes += PartitionedParameters::bytes_needed(blocks, partition, dtype, config);
  return bytes;
}

const void* DataParallel::engine_grads() const {
  return grads_ ? grads_->partition_grads() : buffers_.grads;
}

size_t DataParallel::engine_grads_begin() const {
  return grads_ ? partition_.range(rank()).begin : 0;
}

void* DataParallel::engine_working_params() {
  return params_ ? params_->partition_params() : buffers_.working_params;
}

ParamRange DataParallel::engine_working_range() const {
  return params_ ? partition_.range(rank()) : ParamRange{0, buffers_.num_params};
}

void DataParallel::start_micro_batch(int micro) {
  if (grads_) grads_->start_micro_batch(micro);
}

void DataParallel::finish_micro_batch() {
  if (grads_) grads_->finish_micro_batch();
}

void DataParallel::parameters_loaded() {
  if (params_) params_->parameters_changed();
}

const void* DataParallel::acquire_params(int block) {
  if (params_) return params_->acquire(block);
  TANDEM_CHECK(buffers_.working_params != nullptr, "DataParallel: no working parameters");
  return static_cast<const char*>(buffers_.working_params) +
         buffers_.blocks.at(block).begin * storage_dtype_bytes(buffers_.working_dtype);
}

void DataParallel::release_params(int block) {
  if (params_) params_->release(block);
}

void* DataParallel::acquire_grads(int block) {
  TANDEM_CHECK(grads_ != nullptr, "DataParallel: stage ", config_.stage,
               " keeps the model's gradients in the model");
  return grads_->acquire(block);
}

void DataParallel::release_grads(int block) { grads_->release(block); }

ParamRange DataParallel::state_range() const {
  if (config_.stage == 0) return {0, buffers_.num_params};
  return partition_.range(rank());
}

void DataParallel::gradients_final(size_t begin, size_t end, const Reduced& reduced) {
  TANDEM_CHECK(begin <= end && end <= buffers_.num_params, "gradients_final: [", begin, ", ", end,
               ") is outside the ", buffers_.num_params, " gradients");
  if (begin == end) return;
  announced_ += end - begin;
  if (world_size() == 1) {  // nothing to reduce: hand the range on at once
    reduced(begin, end);
    return;
  }
  if (grads_) {  // reduced (or being reduced) as the model released the block
    const ParamRange mine = state_range();
    const size_t b = std::max(begin, mine.begin), e = std::min(end, mine.end);
    if (b < e) handoff_.push_back({0, {b, e}});
    grads_->complete_reductions(false);
    hand_on(reduced, false);
    return;
  }
  pending_.push_back({begin, end});
  pending_elements_ += end - begin;
  // Without overlap, stage 1 reduces once the step's gradients are all final.
  const bool early = config_.overlap_comm && (config_.stage == 0 || queue_ != nullptr);
  if (early && pending_elements_ >= config_.reduce_bucket_size) {
    for (const ParamRange& r : pending_) reduce(r.begin, r.end);
    pending_.clear();
    pending_elements_ = 0;
  }
  hand_on(reduced, false);
}

void DataParallel::finish_reduction(const Reduced& reduced) {
  if (grads_) {
    TANDEM_CHECK(announced_ == buffers_.num_params, "data parallelism: ", announced_, " of ",
                 buffers_.num_params,
                 " gradients were announced final this step; every gradient must be, exactly "
                 "once");
    announced_ = 0;
    grads_->complete_reductions(true);
    hand_on(reduced, true);
    return;
  }
  if (announced_ == 0)
    pending_.push_back({0, buffers_.num_params});
  else if (world_size() == 1)
    pending_.clear();  // handed on as announced
  TANDEM_CHECK(announced_ == 0 || announced_ == buffers_.num_params,
               "data parallelism: ", announced_, " of ", buffers_.num_params,
               " gradients were announced final this step; every gradient must be, exactly once");
  for (const ParamRange& r : pending_) reduce(r.begin, r.end);
  pending_.clear();
  pending_elements_ = 0;
  announced_ = 0;
  hand_on(reduced, true);
}

void DataParallel::reduce(size_t begin, size_t end) {
  const ParamRange mine = state_range();
  for (size_t b = begin; b < end;) {
    // A bucket never straddles two partitions (at stage 1 it goes to one owner).
    const int owner = partition_.owner(b);
    const size_t partition_end = std::min(end, partition_.range(owner).end);
    const size_t e = std::min(partition_end, b + config_.reduce_bucket_size);
    const CollectiveQueue::Ticket ticket = world_size() > 1 ? reduce_piece(b, e, owner) : 0;
    const size_t rb = std::max(b, mine.begin), re = std::min(e, mine.end);
    if (rb < re) handoff_.push_back({ticket, {rb, re}});
    b = e;
  }
}

void DataParallel::hand_on(const Reduced& reduced, bool wait) {
  while (!handoff_.empty()) {
    const Handoff next = handoff_.front();
    if (grads_) {
      if (grads_->reducing(next.range.begin, next.range.end)) {
        if (!wait) return;
        grads_->complete_reductions(true);
      }
    } else {
      if (!wait && queue_ != nullptr && !queue_->done(next.ticket)) return;
      wait_collective(queue_.get(), next.ticket);  // rethrows a failed reduction
    }
    handoff_.pop_front();
    if (reduced) reduced(next.range.begin, next.range.end);
  }
}

void DataParallel::buffer_collective(std::function<void()> work) {
  wait_collective(queue_.get(), run_collective(queue_.get(), std::move(work)));
}

CollectiveQueue::Ticket DataParallel::reduce_piece(size_t begin, size_t end, int owner) {
  // The range was announced once its kernels were queued: they must be done before
  // another stream (NCCL's) or the host (MPI) reads it.
  buffers_.backend->synchronize();
  const size_t n = end - begin;
  const bool to_owner = config_.stage >= 1;
  const bool is_owner = rank() == owner;
  Communicator& comm = buffer_comm_;
  if (buffers_.grad_dtype == StorageDType::kF32) {
    float* g = static_cast<float*>(buffers_.grads) + begin;
    return run_collective(queue_.get(), [&comm, g, n, to_owner, is_owner, owner] {
      if (to_owner)
        comm.reduce_sum(g, is_owner ? g : nullptr, n, owner);
      else
        comm.all_reduce_sum(g, n);
    });
  }
  // bf16: summed as bf16 (half the bytes), every addition rounded to bf16 as the
  // micro-batches of one rank are added.
  Bf16* g = static_cast<Bf16*>(buffers_.grads) + begin;
  return run_collective(queue_.get(), [&comm, g, n, to_owner, is_owner, owner] {
    if (to_owner)
      comm.reduce_sum_bf16(g, is_owner ? g : nullptr, n, owner);
    else
      comm.all_reduce_sum_bf16(g, n);
  });
}

double DataParallel::grad_sum_of_squares(const std::function<double()>& whole_buffer) {
  if ((config_.stage == 0 || world_size() == 1) && !grads_) return whole_buffer();
  // Each partition starts on a block boundary: its blocks' partials are the full
  // buffer's, gathered and summed in block order as sum_of_squares does.
  const size_t blocks_per_rank = partition_.partition_size() / kSumOfSquaresBlock;
  std::vector<double> mine(blocks_per_rank, 0.0);
  const ParamRange range = state_range();
  if (range.size() > 0) {
    // The gradients of this rank's partition, wherever they live.
    const size_t first = range.begin - engine_grads_begin();
    if (buffers_.grad_dtype == StorageDType::kF32) {
      buffers_.backend->kernels<float>().sum_of_squares_blocks(
          static_cast<const float*>(engine_grads()) + first, range.size(), mine.data());
    } else {
      buffers_.backend->kernels<Bf16>().sum_of_squares_blocks(
          static_cast<const Bf16*>(engine_grads()) + first, range.size(), mine.data());
    }
  }
  std::vector<double> all(blocks_per_rank * world_size());
  comm_.all_gather(mine.data(), all.data(), mine.size() * sizeof(double));
  const size_t blocks = (buffers_.num_params + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock;
  return sum_in_order(all.data(), blocks);
}

void DataParallel::set_piece_needed(PartitionedParameters::PieceNeeded needed) {
  if (params_) params_->set_piece_needed(std::move(needed));
}

bool DataParallel::gathers_working_params() const {
  return params_ == nullptr && config_.stage > 0 && world_size() > 1;
}

void DataParallel::gather_working_params() {
  if (params_) {
    params_->parameters_changed();
    return;
  }
  if (config_.stage == 0 || world_size() == 1) return;
  // The engine's writes of this rank's partition are done (its step synchronizes); each
  // rank's partition sits at rank * S of the padded buffer: an in-place all-gather.
  const size_t bytes = partition_.partition_size() * storage_dtype_bytes(buffers_.working_dtype);
  char* all = static_cast<char*>(buffers_.working_params);
  Communicator& comm = buffer_comm_;
  const int me = rank();
  buffer_collective([&comm, all, me, bytes] { comm.all_gather(all + me * bytes, all, bytes); });
}

void DataParallel::gather_partitions(void* data, size_t elem_bytes) {
  if (config_.stage == 0 || world_size() == 1) return;
  const size_t S = partition_.partition_size();
  const size_t bucket = std::min(S, config_.allgather_bucket_size);
  const int world = world_size();
  std::vector<char> send(bucket * elem_bytes), recv(world * bucket * elem_bytes);
  auto* bytes = static_cast<char*>(data);
  const ParamRange mine = partition_.range(rank());
  for (size_t offset = 0; offset < S; offset += bucket) {
    const size_t count = std::min(bucket, S - offset);
    // This rank's slice [offset, offset + count) of its partition, zero past the end.
    std::fill(send.begin(), send.end(), 0);
    const size_t b = std::min(mine.end, mine.begin + offset);
    const size_t e = std::min(mine.end, mine.begin + offset + count);
    if (b < e) std::memcpy(send.data(), bytes + b * elem_bytes, (e - b) * elem_bytes);
    comm_.all_gather(send.data(), recv.data(), count * elem_bytes);
    for (int r = 0; r < world; r++) {
      if (r == rank()) continue;
      const ParamRange theirs = partition_.range(r);
      const size_t tb = std::min(theirs.end, theirs.begin + offset);
      const size_t te = std::min(theirs.end, theirs.begin + offset + count);
      if (tb < te)
        std::memcpy(bytes + tb * elem_bytes, recv.data() + r * count * elem_bytes,
                    (te - tb) * elem_bytes);
    }
  }
}

float DataParallel::global_mean_loss(const std::vector<float>& micro_losses, bool micro_major) {
  const size_t A = micro_losses.size(), N = static_cast<size_t>(world_size());
  std::vector<float> all(A * N);  // rank-major: [rank][micro]
  if (N == 1) {
    all = micro_losses;
  } else {
    comm_.all_gather(micro_losses.data(), all.data(), A * sizeof(float));
  }
  double sum = 0.0;
  for (size_t k = 0; k < all.size(); k++) sum += micro_major ? all[(k % N) * A + k / N] : all[k];
  return static_cast<float>(sum / static_cast<double>(all.size()));
}

}  // namespace tandem
