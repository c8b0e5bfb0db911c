// The run configuration: a JSON file with DeepSpeed's key names where the concept is
// the same, plus `--set key=value` overrides from the command line. Every key is declared
// once, in config/train_config.cc's schema, which reads, checks and writes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/enum_names.h"
#include "tandem/device/device_kind.h"
#include "tandem/model/model_config.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/zero/zero_config.h"

namespace tandem {

// "auto" for train_micro_batch_size_per_gpu, gradient_accumulation_steps or
// activation_checkpointing.interval (the spelling of DeepSpeed's Hugging Face integration):
// chosen at the start of a run by the step planner (config/step_plan.h), for the highest
// predicted tokens/s that fits. A config whose settings are all numbers trains as written.
inline constexpr int kAuto = -1;

struct DataConfig {
  // A raw text file (byte tokenizer) or an llm.c token shard (*.bin).
  std::string train_path;
  // Optional; if empty, the last `val_fraction` of the training tokens is held out.
  std::string val_path;
  double val_fraction = 0.1;
};

struct SchedulerConfig {         // JSON: "scheduler": {"type": "WarmupCosineLR", "params": {...}}
  int64_t warmup_num_steps = 0;  // linear warm-up from 0 to lr
  double cos_min_ratio = 0.1;    // cosine decay to lr * cos_min_ratio at the last step
};

enum class CheckpointFailure { kStop, kContinue };
inline constexpr EnumName<CheckpointFailure> kCheckpointFailureNames[] = {
    {CheckpointFailure::kStop, "stop"}, {CheckpointFailure::kContinue, "continue"}};

struct TrainLoopConfig {  // JSON: "train": {...}
  int64_t steps = 1000;
  uint64_t seed = 1337;
  int seq_len = 0;              // T; 0 means model.context_length. Must be <= context_length.
  int64_t eval_interval = 100;  // 0 disables evaluation during training
  int64_t eval_batches = 20;
  int64_t checkpoint_interval = 0;  // 0: only a checkpoint at the end
  int64_t log_interval = 10;        // progress lines when stderr is not a terminal
  std::string output_dir = "runs/default";
  int sample_bytes = 300;  // bytes sampled and printed at the end; 0 disables
  // A Hugging Face model directory (config.json + safetensors weights) whose weights start
  // the run instead of the seed's initialisation (fine-tuning; ckpt/init_from.h). Empty:
  // initialise from train.seed.
  std::string init_from;
  // Bytes of weights per file: beyond it model.safetensors is split into
  // model-0000k-of-0000n.safetensors with model.safetensors.index.json, as Hugging Face's
  // save_pretrained does (its default, 5 GB).
  int64_t max_shard_size = 5'000'000'000;
  // Checkpoints are snapshotted while the next step computes and written in the
  // background (lazy); false: the loop stops until every byte is written.
  bool lazy_checkpoints = true;
  // Keep the newest N checkpoints, removing older ones once a newer one is committed; 0
  // keeps all.
  int64_t keep_checkpoints = 0;
  // Host memory a checkpoint's snapshot may take, in MiB: a full copy of the state when it
  // fits, else a pool of this size that the snapshot streams through (config/memory_plan.h,
  // CheckpointSnapshotPlan). 0: what the machine has left after the plan's other tiers,
  // with a pool of at most 256 MiB.
  double checkpoint_memory_mb = 0;
  // A step whose loss or gradient norm is not finite is skipped (the optimizer state and
  // the step count stay as they are; its batch is used up); after this many in a row
  // training stops with an error. 0: the first such step stops it.
  int64_t max_skipped_steps = 3;
  // A checkpoint that cannot be written (disk full): stop training with the error, or
  // note it and go on (the previous checkpoint stays intact either way).
  CheckpointFailure checkpoint_failure = CheckpointFailure::kStop;
};

// JSON: "activation_checkpointing": {...}, DeepSpeed's section: recompute activations in
// backward instead of keeping them (model/recompute_segments.h). The gradients are the same
// bits either way; a step costs about one more forward.
struct ActivationCheckpointingConfig {
  // Keep every `interval`-th layer's output and recompute the layers between inside
  // backward; 0: keep every layer's activations (off); kAuto: the step planner chooses it
  // and cpu_checkpointing.
  int interval = 0;
  // Keep those outputs in pinned host memory, copied back ahead of their segment's backward:
  // the device holds two of them instead of L / interval.
  bool cpu_checkpointing = false;
};

struct DeviceConfig {  // JSON: "device": {...}
  // "cpu" (kHostOnly): model and optimizer on the host (the host-only device backend, see
  // device/device.h); "cuda": the model on the GPU, the optimizer state per schedule.
  DeviceKind type = DeviceKind::kHostOnly;
  double memory_gb = 16.0;  // capacity of the device memory the update engine may use
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  // "optimizer", and any section of the optimizer's own ("demo" for DeMo): its family's
  // (optim/optimizer_family.h).
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  TrainLoopConfig train;
  // "zero_optimization": {"sub_group_size"}, "offload_optimizer": {"schedule", "ratio",
  // "stride", "staging_buffers"}
  OffloadSettings offload{.schedule = UpdateSchedule::kDevice, .overlap_forward = true};
  // "zero_optimization": {"stage", "overlap_comm", bucket sizes...}: data parallelism.
  ZeroConfig zero;
  DeviceConfig device;
  ActivationCheckpointingConfig activation_checkpointing;
  // "bf16": {"enabled": true}: the model's parameters (working copy), gradients and
  // activations in bf16 with fp32 arithmetic; master weights and Adam moments stay fp32.
  bool bf16 = false;
  int micro_batch_size = 8;             // "train_micro_batch_size_per_gpu" (B), or kAuto
  int gradient_accumulation_steps = 1;  // "gradient_accumulation_steps", or kAuto
  // "train_batch_size": sequences per optimizer step over all ranks, B x accumulation x
  // ranks (DeepSpeed's key and rule); 0: whatever those give. Needed when B or the
  // accumulation is "auto".
  int64_t train_batch_size = 0;
  // "train_batch_tokens": the same in tokens, for those who think of a batch so; must be
  // train_batch_size x the sequence length (it sets train_batch_size when that is absent).
  int64_t train_batch_tokens = 0;
  float gradient_clipping = 1.0f;  // "gradient_clipping"; 0 disables

  // Where it came from (load_train_config; not a key): the file and the --set overrides,
  // for the commands messages suggest. Empty when made in code.
  std::filesystem::path source_file;
  std::vector<std::string> source_overrides;

  int seq_len() const { return train.seq_len > 0 ? train.seq_len : model.context_length; }
  // Whether a setting is "auto": the step planner must choose before the run can start.
  bool has_auto_step_settings() const {
    return micro_batch_size == kAuto || gradient_accumulation_steps == kAuto ||
           activation_checkpointing.interval == kAuto;
  }
  StorageDType storage_dtype() const { return bf16 ? StorageDType::kBF16 : StorageDType::kF32; }
  // "--config configs/x.json --set a=1": the arguments that give this config again ("--config
  // FILE" when made in code), shell-quoted where needed.
  std::string source_arguments() const;
};

// Parses and validates a configuration. Unknown keys and invalid values throw
// tandem::Error with a message naming the full key path ("optimizer.params.lr") and
// what is allowed (with a "did you mean" suggestion for near-miss key names).
TrainConfig parse_train_config(const nlohmann::json& json);

// Applies one "dotted.key.path=value" override to a JSON config. The value is parsed
// as JSON when it is valid JSON (numbers, true/false, arrays, quoted strings) and
// taken as a string otherwise. Throws tandem::Error for a malformed override.
void apply_config_override(nlohmann::json& json, const std::string& assignment);

// Reads the file (errors name it, with the line/column of a JSON syntax error),
// applies the overrides in order, and parses.
TrainConfig load_train_config(const std::filesystem::path& path,
                              const std::vector<std::string>& overrides);

// The full configuration, every field written out, in the same schema that
// parse_train_config reads: parse_train_config(to_json(c)) == c.
nlohmann::json to_json(const TrainConfig& config);

}  // namespace tandem
