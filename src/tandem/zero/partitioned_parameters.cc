#include "tandem/zero/partitioned_parameters.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

}  // namespace

PartitionedParameters::Sizes PartitionedParameters::sizes(const std::vector<ParamRange>& blocks,
                                                          const ZeroConfig& config) {
  Sizes sizes;
  for (const ParamRange& b : blocks)
    if (b.size() <= config.stage3_param_persistence_threshold) sizes.persistent += b.size();
  const auto [largest, second] =
      two_largest_blocks(blocks, config.stage3_param_persistence_threshold);
  const size_t needed = largest + second;
  TANDEM_CHECK(config.stage3_max_live_parameters >= needed,
               "zero_optimization.stage3_max_live_parameters = ", config.stage3_max_live_parameters,
               " is too small: the model uses two blocks of ", needed,
               " parameters together; raise it to at least ", needed);
  // Two blocks at the ends of the buffer: the one in use and the next (prefetched, or in
  // use too). More room would hold no more blocks.
  sizes.live = needed;
  return sizes;
}

size_t PartitionedParameters::bytes_needed(const std::vector<ParamRange>& blocks,
                                           const ZeroPartition& partition, StorageDType dtype,
                                           const ZeroConfig& config) {
  const Sizes s = sizes(blocks, config);
  return (partition.partition_size() + s.persistent + s.live) * storage_dtype_bytes(dtype);
}

PartitionedParameters::PartitionedParameters(Communicator& comm, ComputeBackend& backend,
                                             StorageDType dtype, const ZeroPartition& partition,
                                             std::vector<ParamRange> blocks,
                                             const ZeroConfig& config, CollectiveQueue* queue)
    : comm_(comm),
      backend_(backend),
      dtype_(dtype),
      elem_(storage_dtype_bytes(dtype)),
      partition_range_(partition),
      blocks_(std::move(blocks)),
      config_(config),
      queue_(queue) {
  const Sizes s = sizes(blocks_, config_);
  partition_ = backend_.allocate(partition_range_.partition_size() * elem_);
  backend_.fill_zero(partition_.as<void>(), partition_range_.partition_size() * elem_);
  persistent_offset_.assign(blocks_.size(), kNone);
  persistent_fresh_.assign(blocks_.size(), 0);
  size_t offset = 0;
  for (size_t b = 0; b < blocks_.size(); b++) {
    if (blocks_[b].size() > config_.stage3_param_persistence_threshold) continue;
    persistent_offset_[b] = offset;
    offset += blocks_[b].size();
  }
  if (s.persistent > 0) persistent_buffer_ = backend_.allocate(s.persistent * elem_);
  live_capacity_ = s.live;
  if (live_capacity_ > 0) live_ = backend_.allocate(live_capacity_ * elem_);
  allocated_bytes_ = bytes_needed(blocks_, partition_range_, dtype_, config_);
}

bool PartitionedParameters::persistent(int block) const {
  return persistent_offset_[block] != kNone;
}

PartitionedParameters::Resident* PartitionedParameters::resident(int block) {
  for (Resident& r : residents_)
    if (r.block == block) return &r;
  return nullptr;
}

size_t PartitionedParameters::live_elements() const {
  size_t n = 0;
  for (const Resident& r : residents_) n += r.size;
  return n;
}

size_t PartitionedParameters::find_room(size_t size, bool evict) {
  if (size > live_capacity_) return kNone;
  // Blocks go at either end of the live buffer. At most two are in use at once and the
  // buffer holds the two largest side by side, so with one in use at an end the other
  // end always has room: a block in use can never be in the way of both.
  const size_t ends[2] = {0, live_capacity_ - size};
  auto overlaps = [&](const Resident& r, size_t offset) {
    return r.offset < offset + size && offset < r.offset + r.size;
  };
  for (size_t offset : ends) {
    if (std::none_of(residents_.begin(), residents_.end(),
                     [&](const Resident& r) { return overlaps(r, offset); }))
      return offset;
  }
  if (!evict) return kNone;
  // An end where only released blocks are in the way: the one whose latest use is oldest.
  size_t best = kNone;
  uint64_t best_age = std::numeric_limits<uint64_t>::max();
  for (size_t offset : ends) {
    bool blocked = false;
    uint64_t newest = 0;
    for (const Resident& r : residents_) {
      if (!overlaps(r, offset)) continue;
      blocked = blocked || r.users > 0;
      newest = std::max(newest, r.last_used);
    }
    if (!blocked && newest < best_age) {
      best = offset;
      best_age = newest;
    }
  }
  if (best == kNone) return kNone;
  // A prefetched block never used may still be arriving: the new block's own piece, copied
  // in before its gather, must not be overwritten by it.
  for (const Resident& r : residents_)
    if (overlaps(r, best)) wait_collective(queue_, r.gathered);
  std::erase_if(residents_, [&](const Resident& r) { return overlaps(r, best); });
  return best;
}

CollectiveQueue::Ticket PartitionedParameters::gather(int block, char* dst) {
  gathered_blocks_++;
  const ParamRange range = blocks_[block];
  const int me = comm_.rank();
  const int first = partition_range_.owner(range.begin);
  const int last = partition_range_.owner(range.end - 1);
  if (me >= first && me <= last) {
    // This rank's piece into place first: the broadcast sends it from there.
    const ParamRange mine = partition_range_.range(me);
    const size_t b = std::max(range.begin, mine.begin), e = std::min(range.end, mine.end);
    if (piece_needed_) piece_needed_({b, e});
    backend_.copy(dst + (b - range.begin) * elem_,
                  partition_.as<const char>() + (b - mine.begin) * elem_, (e - b) * elem_);
  }
  // The copy above, the update engine's writes of the partition, and the kernels that used
  // what dst held before must be done before the communicator touches it.
  backend_.synchronize();
  // Each owner's piece: [offset in dst, bytes).
  std::vector<std::pair<int, ParamRange>> pieces;
  for (int owner = first; owner <= last; owner++) {
    const ParamRange theirs = partition_range_.range(owner);
    const size_t b = std::max(range.begin, theirs.begin), e = std::min(range.end, theirs.end);
    if (b < e) pieces.push_back({owner, {(b - range.begin) * elem_, (e - range.begin) * elem_}});
  }
  Communicator& comm = comm_;
  return run_collective(queue_, [&comm, dst, pieces = std::move(pieces)] {
    for (const auto& [owner, bytes] : pieces)
      comm.broadcast(dst + bytes.begin, bytes.size(), owner);
  });
}

const void* PartitionedParameters::acquire(int block) {
  TANDEM_CHECK(block >= 0 && static_cast<size_t>(block) < blocks_.size(), "block ", block,
               " is not one of the model's ", blocks_.size());
  if (recording_) order_.push_back(block);
  if (persistent(block)) {
    char* data = persistent_buffer_.as<char>() + persistent_offset_[block] * elem_;
    if (!persistent_fresh_[block]) wait_collective(queue_, gather(block, data));
    persistent_fresh_[block] = 1;
    return data;
  }
  // Where the model is in the recorded order (another sequence, such as an evaluation's
  // forward passes, finds its place by the block).
  if (!recording_) {
    auto it =
        std::find(order_.begin() + static_cast<std::ptrdiff_t>(position_), order_.end(), block);
    if (it == order_.end()) it = std::find(order_.begin(), order_.end(), block);
    position_ = it == order_.end() ? order_.size() : static_cast<size_t>(it - order_.begin()) + 1;
  }
  Resident* r = resident(block);
  if (r == nullptr) {
    const size_t size = blocks_[block].size();
    const size_t offset = find_room(size, true);
    TANDEM_CHECK(offset != kNone,
                 "zero_optimization.stage3_max_live_parameters: no room for block ", block, " (",
                 size, " parameters) beside the blocks in use; raise it");
    residents_.push_back({block, offset, size, 0, 0, 0});
    residents_.back().gathered = gather(block, live_.as<char>() + offset * elem_);
    r = &residents_.back();
    peak_live_ = std::max(peak_live_, live_elements());
  }
  r->users++;
  r->last_used = ++clock_;
  // The next block's gather is queued before this one is waited for: it runs while the
  // model computes with this one. (Prefetching may move the residents' records.)
  if (!recording_) prefetch_after(block);
  r = resident(block);
  wait_collective(queue_, r->gathered);
  r->gathered = 0;
  return live_.as<char>() + r->offset * elem_;
}

void PartitionedParameters::prefetch_after(int block) {
  // The next block of the recorded order that is not here yet: the one used next.
  for (size_t i = position_; i < order_.size(); i++) {
    const int next = order_[i];
    if (next == block || persistent(next)) continue;
    if (resident(next) != nullptr) return;
    const size_t size = blocks_[next].size();
    if (size > config_.stage3_prefetch_bucket_size) return;
    const size_t offset = find_room(size, true);
    if (offset == kNone) return;
    residents_.push_back({next, offset, size, 0, ++clock_, 0});
    residents_.back().gathered = gather(next, live_.as<char>() + offset * elem_);
    prefetched_blocks_++;
    peak_live_ = std::max(peak_live_, live_elements());
    return;
  }
}

void PartitionedParameters::release(int block) {
  if (persistent(block)) return;
  Resident* r = resident(block);
  TANDEM_CHECK(r != nullptr && r->users > 0, "release of block ", block,
               "'s parameters, which are not acquired");
  r->users--;
}

void PartitionedParameters::parameters_changed() {
  for (const Resident& r : residents_)
    TANDEM_CHECK(r.users == 0, "the parameters changed while block ", r.block, " was in use");
  // Prefetched gathers of the old parameters may still be running into the live buffer.
  if (queue_ != nullptr) queue_->wait_all();
  residents_.clear();
  if (!order_.empty()) recording_ = false;
  position_ = 0;
  std::fill(persistent_fresh_.begin(), persistent_fresh_.end(), 0);
}

}  // namespace tandem
