#include "tandem/zero/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/optim/grad_clip.h"

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
  TANDEM_CHECK(config_.stage >= 0 && config_.stage <= 2, "zero_optimization.stage ", config_.stage,
               " is not supported here; use 0, 1 or 2");
  TANDEM_CHECK(config_.reduce_bucket_size >= 1 && config_.allgather_bucket_size >= 1,
               "zero_optimization bucket sizes must be at least 1 element");
  TANDEM_CHECK(buffers_.backend != nullptr, "DataParallel: the model's backend is missing");
}

size_t DataParallel::working_params_capacity(size_t num_params, int world_size, int stage) {
  if (stage == 0 || world_size == 1) return num_params;
  return ZeroPartition(num_params, world_size).padded_size();
}

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
  pending_.push_back({begin, end});
  pending_elements_ += end - begin;
  // Stage 1 reduces once the step's gradients are all final; 0 and 2 may start early.
  const bool early = config_.overlap_comm && config_.stage != 1;
  if (!early || pending_elements_ < config_.reduce_bucket_size) return;
  for (const ParamRange& r : pending_) reduce(r.begin, r.end, reduced);
  pending_.clear();
  pending_elements_ = 0;
}

void DataParallel::finish_reduction(const Reduced& reduced) {
  if (announced_ == 0)
    pending_.push_back({0, buffers_.num_params});
  else if (world_size() == 1)
    pending_.clear();  // handed on as announced
  TANDEM_CHECK(announced_ == 0 || announced_ == buffers_.num_params,
               "data parallelism: ", announced_, " of ", buffers_.num_params,
               " gradients were announced final this step; every gradient must be, exactly once");
  for (const ParamRange& r : pending_) reduce(r.begin, r.end, reduced);
  pending_.clear();
  pending_elements_ = 0;
  announced_ = 0;
}

void DataParallel::reduce(size_t begin, size_t end, const Reduced& reduced) {
  const ParamRange mine = state_range();
  for (size_t b = begin; b < end;) {
    // A bucket never straddles two partitions (at stage 2 it goes to one owner).
    const int owner = partition_.owner(b);
    const size_t partition_end = std::min(end, partition_.range(owner).end);
    const size_t e = std::min(partition_end, b + config_.reduce_bucket_size);
    if (world_size() > 1) reduce_piece(b, e, owner);
    const size_t rb = std::max(b, mine.begin), re = std::min(e, mine.end);
    if (rb < re && reduced) reduced(rb, re);
    b = e;
  }
}

void DataParallel::reduce_piece(size_t begin, size_t end, int owner) {
  // The range was announced once its kernels were queued: they must be done before
  // another stream (NCCL's) or the host (MPI) reads it.
  buffers_.backend->synchronize();
  const size_t n = end - begin;
  const bool to_owner = config_.stage >= 1;
  if (buffers_.grad_dtype == StorageDType::kF32) {
    float* g = static_cast<float*>(buffers_.grads) + begin;
    if (to_owner)
      buffer_comm_.reduce_sum(g, rank() == owner ? g : nullptr, n, owner);
    else
      buffer_comm_.all_reduce_sum(g, n);
    return;
  }
  // bf16: summed as bf16 (half the bytes), every addition rounded to bf16 as the
  // micro-batches of one rank are added.
  Bf16* g = static_cast<Bf16*>(buffers_.grads) + begin;
  if (to_owner)
    buffer_comm_.reduce_sum_bf16(g, rank() == owner ? g : nullptr, n, owner);
  else
    buffer_comm_.all_reduce_sum_bf16(g, n);
}

double DataParallel::grad_sum_of_squares(const std::function<double()>& whole_buffer) {
  if (config_.stage == 0 || world_size() == 1) return whole_buffer();
  // Each partition starts on a block boundary: its blocks' partials are the full
  // buffer's, gathered and summed in block order as sum_of_squares does.
  const size_t blocks_per_rank = partition_.partition_size() / kSumOfSquaresBlock;
  std::vector<double> mine(blocks_per_rank, 0.0);
  const ParamRange range = state_range();
  if (range.size() > 0) {
    if (buffers_.grad_dtype == StorageDType::kF32) {
      buffers_.backend->sum_of_squares_blocks(
          static_cast<const float*>(buffers_.grads) + range.begin, range.size(), mine.data());
    } else {
      buffers_.backend->sum_of_squares_blocks(
          static_cast<const Bf16*>(buffers_.grads) + range.begin, range.size(), mine.data());
    }
  }
  std::vector<double> all(blocks_per_rank * world_size());
  comm_.all_gather(mine.data(), all.data(), mine.size() * sizeof(double));
  const size_t blocks = (buffers_.num_params + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock;
  return sum_in_order(all.data(), blocks);
}

void DataParallel::gather_working_params() {
  if (config_.stage == 0 || world_size() == 1) return;
  // The engine's writes of this rank's partition are done (its step synchronizes); each
  // rank's partition sits at rank * S of the padded buffer: an in-place all-gather.
  const size_t bytes = partition_.partition_size() * storage_dtype_bytes(buffers_.working_dtype);
  char* all = static_cast<char*>(buffers_.working_params);
  buffer_comm_.all_gather(all + rank() * bytes, all, bytes);
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

float DataParallel::global_mean_loss(const std::vector<float>& micro_losses) {
  std::vector<float> all(micro_losses.size() * world_size());
  if (world_size() == 1) {
    all = micro_losses;
  } else {
    comm_.all_gather(micro_losses.data(), all.data(), micro_losses.size() * sizeof(float));
  }
  double sum = 0.0;
  for (float loss : all) sum += loss;
  return static_cast<float>(sum / static_cast<double>(all.size()));
}

}  // namespace tandem
