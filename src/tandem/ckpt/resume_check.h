// What a resumed run must share with the run that wrote its checkpoint for the
// continuation to be bit-exact, and where a resumed run writes.
//
// A checkpoint records its run's config (trainer_state.json), the XXH3 and count of the
// training tokens and the world size. Resuming compares them with the run about to start:
// the model, the micro-batch, the sequence length, the micro-batches per step (world size
// x gradient_accumulation_steps: N ranks give the bits of one rank accumulating N), the
// seed, the data (its tokens, wherever the file now is), gradient clipping, bf16, the
// optimizer with its hyperparameters and the learning-rate schedule. Update schedules,
// subgroup sizes, ZeRO stages and checkpoint settings give the same bits, so they may
// change; train.steps may grow (the cosine schedule then spans the new length).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/train_config.h"

namespace tandem {

struct ResumeMismatch {
  std::string key;  // "optimizer.params.lr", "data (the training tokens)", ...
  std::string checkpoint, now;
};

// What the run about to start trains on: its tokens (XXH3-64 hex and count) and ranks.
struct RunData {
  std::string train_tokens_xxh3;
  uint64_t train_tokens = 0;
  int world_size = 1;
};

// The differences between the checkpoint's run (`then`) and the one about to start that
// change the numbers; empty when the continuation is bit-exact. Checks the checkpoint
// does not record (written before they were) are skipped.
std::vector<ResumeMismatch> resume_mismatches(const TrainingState& then, const TrainConfig& now,
                                              const RunData& data);
// "optimizer.params.lr: the checkpoint has 0.003, the config 0.001; ..."
std::string describe(const std::vector<ResumeMismatch>& mismatches);

// Whether the checkpoint `state`, read from `path`, may resume as the run `now` on `data`:
// throws for another model or optimizer, a step beyond train.steps, or (unless
// `allow_inexact`) a difference the numbers depend on, each naming the fix. Returns notes
// for the user: an inexact resume allowed, a changed train.steps.
std::vector<std::string> check_resumable(const std::filesystem::path& path,
                                         const TrainingState& state, const TrainConfig& now,
                                         const RunData& data, bool allow_inexact);

// The run directory a checkpoint given to --resume belongs to: a run directory itself,
// the parent of its checkpoints/ directory, or the run of a step_* directory inside one;
// nothing for a checkpoint outside that layout.
std::optional<std::filesystem::path> run_directory_of(const std::filesystem::path& resume);

}  // namespace tandem
