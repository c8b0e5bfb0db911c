// Helpers of the tests that train whole (tiny) runs: a small corpus, a tiny config, quiet
// options. Apart from test_util.h so that kernel and layer tests do not compile against
// the trainer.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_util.h"
#include "tandem/core/file_io.h"
#include "tandem/train/trainer.h"

namespace tandem::testing {

// The first `bytes` of the bundled Tiny Shakespeare, as a small training text.
inline void write_small_corpus(const std::filesystem::path& path, size_t bytes = 20000) {
  const std::string text = read_file_text((source_dir() / "data" / "tinyshakespeare.txt").string());
  write_file_atomic(path, text.substr(0, bytes));
}

// A byte-level model small enough to train a few steps in milliseconds.
inline nlohmann::json tiny_run_config(const std::filesystem::path& data,
                                      const std::filesystem::path& output_dir) {
  return {
      {"model",
       {{"vocab_size", 256},
        {"context_length", 16},
        {"n_layer", 2},
        {"n_head", 2},
        {"n_embd", 16}}},
      {"data", {{"train_path", data.string()}, {"val_fraction", 0.2}}},
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
      {"scheduler",
       {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 3}, {"cos_min_ratio", 0.1}}}}},
      {"train",
       {{"steps", 20},
        {"seed", 7},
        {"seq_len", 16},
        {"eval_interval", 5},
        {"eval_batches", 2},
        {"checkpoint_interval", 0},
        {"output_dir", output_dir.string()},
        {"sample_bytes", 0}}},
  };
}

// Training options that print nothing (tests look at the result, not the progress).
inline TrainOptions quiet() {
  TrainOptions options;
  options.show_progress = false;
  return options;
}

}  // namespace tandem::testing
