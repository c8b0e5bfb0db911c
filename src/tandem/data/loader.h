// Batches of (input, target) windows cut from one token stream, in an order that is a
// pure function of (seed, epoch, batch), so a resumed run sees exactly the batches an
// uninterrupted run would have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class DataLoader {
 public:
  // Where the loader stands: the next batch produced is batch `batch` of epoch `epoch`.
  // A checkpoint stores this; batch is always < batches_per_epoch().
  struct Position {
    uint64_t epoch = 0;
    uint64_t batch = 0;
    bool operator==(const Position&) const = default;
  };

  // The stream is cut into windows of T+1 tokens starting at multiples of T (window i is
  // tokens [i*T, i*T+T+1)), so consecutive windows share one token and there are
  // (N-1)/T of them. With `shuffle`, each epoch visits them in a permutation derived
  // only from (seed, epoch); otherwise in order. `name` ("train", "val") labels errors.
  // The loader keeps a view of `tokens` (and of `loss_mask`): the caller owns them and
  // they must outlive it. A loss mask (data/loss_mask.h; empty: every token counts) holds a
  // byte per token; a target whose byte is 0 is given as kIgnoredTarget.
  // Throws if there are fewer than B windows, or a mask of another length.
  DataLoader(std::span<const int32_t> tokens, int batch_size, int seq_len, uint64_t seed,
             bool shuffle, std::string name, std::span<const uint8_t> loss_mask = {});

  // Fills B windows: inputs[b*T + t] = window_b[t], targets[b*T + t] = window_b[t+1]
  // (kIgnoredTarget where the mask does not count it). Both spans must hold B*T tokens. A
  // batch never straddles two epochs: the windows left over after the last full batch of
  // an epoch are skipped in that epoch.
  void next_batch(std::span<int32_t> inputs, std::span<int32_t> targets);

  bool has_loss_mask() const { return !mask_.empty(); }
  // The targets the loss counts in the batch `ahead` batches after the next one (0: the
  // next), without moving: B * T without a mask.
  uint64_t counted_targets_ahead(uint64_t ahead) const;

  // Moves past `count` batches without reading them, as that many next_batch calls
  // would: a data-parallel rank skips the other ranks' micro-batches of a global batch.
  void skip_batches(uint64_t count);

  Position position() const { return position_; }
  // Throws if position.batch >= batches_per_epoch().
  void set_position(Position position);
  // Back to epoch 0, batch 0.
  void reset() { set_position(Position{}); }

  size_t batches_per_epoch() const { return batches_per_epoch_; }
  size_t num_windows() const { return num_windows_; }
  int batch_size() const { return batch_size_; }
  int seq_len() const { return seq_len_; }

 private:
  // Fills order_ with the window order of position_.epoch.
  void build_order();

  // The window order of `epoch` (order_ when it is the current one).
  std::vector<uint64_t> order_of(uint64_t epoch) const;

  std::span<const int32_t> tokens_;
  std::span<const uint8_t> mask_;
  int batch_size_;
  int seq_len_;
  uint64_t seed_;
  bool shuffle_;
  std::string name_;
  size_t num_windows_ = 0;
  size_t batches_per_epoch_ = 0;
  Position position_;
  uint64_t order_epoch_ = 0;
  std::vector<uint64_t> order_;  // window index for each slot of the current epoch
};

}  // namespace tandem
