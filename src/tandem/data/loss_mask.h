// Loss masks: which tokens of a token shard the loss counts (instruction tuning: the
// answers, not the prompts). tools/tokenize_bpe.py writes one beside each shard X.bin it
// makes from prompt/completion or chat records, as X.mask.bin:
//   a header of 256 little-endian int32 ([0] magic 20261128, [1] version 1, [2] token
//   count, equal to the shard's; the rest zero), then one uint8 per token: 1 = the loss
//   counts the prediction of this token from the tokens before it, 0 = it does not.
// A target the loss does not count is kIgnoredTarget in a batch (PyTorch's ignore_index):
// the loss is the mean over the counted targets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace tandem {

inline constexpr int32_t kIgnoredTarget = -1;

inline constexpr int32_t kLossMaskMagic = 20261128;
inline constexpr int32_t kLossMaskVersion = 1;

// X.bin -> X.mask.bin.
std::filesystem::path loss_mask_path_for(const std::filesystem::path& shard);

// Reads a mask whole. Throws tandem::Error naming the file for anything that is not
// exactly a mask of `expected_count` tokens of 0 and 1: short file, magic, version, a count
// other than the shard's, a body of another length, a byte other than 0 or 1.
std::vector<uint8_t> read_loss_mask(const std::filesystem::path& path, size_t expected_count);

// Writes a mask atomically (a crash leaves the old file or the new one).
void write_loss_mask(const std::filesystem::path& path, std::span<const uint8_t> mask);

}  // namespace tandem
