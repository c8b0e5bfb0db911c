#include "tandem/data/loader.h"

#include <numeric>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/rng.h"
#include "tandem/data/loss_mask.h"

namespace tandem {
namespace {

// MurmurHash3's 64-bit finalizer: mixing the epoch before combining it with the seed
// keeps (seed, epoch) pairs such as (1, 0) and (0, 1) from sharing a stream.
uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Uniform in [0, bound) without modulo bias: rejecting the lowest (2^64 mod bound)
// values leaves a range that is an exact multiple of bound. Written out (not
// std::uniform_int_distribution) because the order must be the same on every platform.
uint64_t uniform_below(Rng& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = rng.next_u64();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

DataLoader::DataLoader(std::span<const int32_t> tokens, int batch_size, int seq_len, uint64_t seed,
                       bool shuffle, std::string name, std::span<const uint8_t> loss_mask)
    : tokens_(tokens),
      mask_(loss_mask),
      batch_size_(batch_size),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle),
      name_(std::move(name)) {
  TANDEM_CHECK(batch_size > 0, name_, " loader: batch size ", batch_size,
               " must be positive (train_micro_batch_size_per_gpu)");
  TANDEM_CHECK(seq_len > 0, name_, " loader: sequence length ", seq_len,
               " must be positive (train.seq_len)");
  num_windows_ = tokens.empty() ? 0 : (tokens.size() - 1) / static_cast<size_t>(seq_len);
  TANDEM_CHECK(num_windows_ >= static_cast<size_t>(batch_size), name_, " split has ", tokens.size(),
               " tokens, too few for one batch of ", batch_size, " x (", seq_len,
               "+1); use a smaller train_micro_batch_size_per_gpu or train.seq_len, or more data");
  TANDEM_CHECK(mask_.empty() || mask_.size() == tokens.size(), name_, " loader: a loss mask of ",
               mask_.size(), " tokens for ", tokens.size(), " tokens");
  batches_per_epoch_ = num_windows_ / static_cast<size_t>(batch_size);
  order_.resize(num_windows_);
  build_order();
}

std::vector<uint64_t> DataLoader::order_of(uint64_t epoch) const {
  std::vector<uint64_t> order(num_windows_);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (!shuffle_) return order;
  Rng rng(seed_ ^ mix64(epoch + 0x9e3779b97f4a7c15ULL));
  // Fisher-Yates from the back: each of the n! orders is equally likely.
  for (size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[uniform_below(rng, i + 1)]);
  }
  return order;
}

void DataLoader::build_order() {
  order_ = order_of(position_.epoch);
  order_epoch_ = position_.epoch;
}

uint64_t DataLoader::counted_targets_ahead(uint64_t ahead) const {
  const size_t B = static_cast<size_t>(batch_size_), T = static_cast<size_t>(seq_len_);
  if (mask_.empty()) return B * T;
  const uint64_t batch = position_.batch + ahead;
  const uint64_t epoch = position_.epoch + batch / batches_per_epoch_;
  const std::vector<uint64_t> other =
      epoch == order_epoch_ ? std::vector<uint64_t>() : order_of(epoch);
  const std::vector<uint64_t>& order = epoch == order_epoch_ ? order_ : other;
  const size_t first_slot = static_cast<size_t>(batch % batches_per_epoch_) * B;
  uint64_t counted = 0;
  for (size_t b = 0; b < B; ++b) {
    const uint8_t* window_mask = mask_.data() + order[first_slot + b] * T;
    for (size_t t = 1; t <= T; ++t) counted += window_mask[t];
  }
  return counted;
}

void DataLoader::next_batch(std::span<int32_t> inputs, std::span<int32_t> targets) {
  const size_t B = static_cast<size_t>(batch_size_);
  const size_t T = static_cast<size_t>(seq_len_);
  TANDEM_CHECK(inputs.size() == B * T && targets.size() == B * T, name_,
               " loader: next_batch got buffers of ", inputs.size(), " and ", targets.size(),
               " tokens, expected B*T = ", B, "*", T, " = ", B * T, " each");
  if (order_epoch_ != position_.epoch) build_order();
  const size_t first_slot = static_cast<size_t>(position_.batch) * B;
  for (size_t b = 0; b < B; ++b) {
    const int32_t* window = tokens_.data() + order_[first_slot + b] * T;
    for (size_t t = 0; t < T; ++t) {
      inputs[b * T + t] = window[t];
      targets[b * T + t] = window[t + 1];
    }
    if (mask_.empty()) continue;
    const uint8_t* window_mask = mask_.data() + order_[first_slot + b] * T;
    for (size_t t = 0; t < T; ++t)
      if (window_mask[t + 1] == 0) targets[b * T + t] = kIgnoredTarget;
  }
  // Advance eagerly so that position() after the last batch of an epoch already reads
  // {epoch + 1, 0}: a position has one spelling, whichever way it was reached.
  if (++position_.batch == batches_per_epoch_) {
    position_.batch = 0;
    ++position_.epoch;
  }
}

void DataLoader::skip_batches(uint64_t count) {
  const uint64_t batch = position_.batch + count;
  position_.epoch += batch / batches_per_epoch_;
  position_.batch = batch % batches_per_epoch_;
}

void DataLoader::set_position(Position position) {
  TANDEM_CHECK(position.batch < batches_per_epoch_, name_,
               " loader: cannot restore position "
               "epoch ",
               position.epoch, " batch ", position.batch, ": an epoch has only ",
               batches_per_epoch_,
               " batches; was the checkpoint made with different data, "
               "batch size or sequence length?");
  position_ = position;
  if (order_epoch_ != position_.epoch) build_order();
}

}  // namespace tandem
