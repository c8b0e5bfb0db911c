// Loading the token streams a run trains and evaluates on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem {

struct TokenSplit {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
  // Loss masks (data/loss_mask.h), a byte per token; empty: the loss counts every token.
  std::vector<uint8_t> train_mask;
  std::vector<uint8_t> val_mask;
  std::string train_mask_path, val_mask_path;  // where they were read ("" for none)
};

// A path ending in ".bin" is read as an llm.c token shard; anything else is raw text,
// tokenized with the byte tokenizer. A missing or empty file is an error naming it.
std::vector<int32_t> load_tokens(const std::filesystem::path& path);

// Loads the training tokens and the validation tokens, each shard with the loss mask beside
// it when there is one (X.mask.bin beside X.bin, data/loss_mask.h). With an empty val_path, the
// last floor(val_fraction * N) training tokens become the validation split (val_fraction must be in
// (0, 1)); otherwise both files are loaded whole and val_fraction is unused. Every token must be <
// vocab_size: the error names the file, the first offending token and its position, and the
// smallest vocab_size that would do. Whether a split is large enough for a batch is the
// DataLoader's check, not this one.
TokenSplit load_dataset(const std::string& train_path, const std::string& val_path,
                        double val_fraction, int vocab_size);

}  // namespace tandem
