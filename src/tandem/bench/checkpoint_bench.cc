#include "tandem/bench/checkpoint_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/scratch_dir.h"
#include "tandem/core/timer.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace fs = std::filesystem;
namespace {

// `pool_mb` 0: a full copy of the state; else the pool it streams through.
CheckpointModeResult measure(const CheckpointBenchOptions& options, const std::string& name,
                             bool lazy, int64_t pool_mb, CheckpointBenchResult& result) {
  const ScratchDir scratch(cat("tandem_bench_checkpoint_", ::getpid(), "_", name));
  TrainConfig config = options.config;
  config.train.steps = options.steps;
  config.train.checkpoint_interval = options.interval;
  config.train.lazy_checkpoints = lazy;
  const int64_t state_mb =
      static_cast<int64_t>(config.model.num_parameters() *
                               optimizer_family(config.optimizer.type).state_bytes_per_param() >>
                           20);
  config.train.checkpoint_memory_mb = static_cast<double>(pool_mb > 0 ? pool_mb : 2 * state_mb + 1);
  config.train.eval_interval = 0;
  config.train.sample_bytes = 0;
  config.train.output_dir = scratch.path().string();
  TrainOptions quiet;
  quiet.show_progress = false;
  const TrainResult run = train(config, quiet);

  CheckpointModeResult mode{
      .name = name, .lazy = lazy, .pool_bytes = static_cast<uint64_t>(pool_mb) << 20};
  std::vector<double> step_ms;
  for (const StepRecord& step : run.steps) step_ms.push_back(step.ms);
  mode.step_ms = median(step_ms);
  double stall_sum = 0, flush_sum = 0;
  mode.flush_fits = true;
  for (const CheckpointRecord& record : run.checkpoints) {
    TANDEM_CHECK(record.error.empty(), record.error);
    if (record.step == options.steps) {
      result.checkpoint_bytes = directory_bytes(record.path);
      continue;  // the last one is synchronous in both modes
    }
    mode.checkpoints++;
    stall_sum += record.stall_ms;
    flush_sum += record.flush_ms;
    mode.stall_ms_max = std::max(mode.stall_ms_max, record.stall_ms);
    mode.flush_fits =
        mode.flush_fits && record.flush_ms <= mode.step_ms * static_cast<double>(options.interval);
  }
  TANDEM_CHECK(mode.checkpoints > 0, "bench checkpoint: ", options.steps, " steps with --interval ",
               options.interval, " take no checkpoint before the last step; raise --steps");
  mode.stall_ms_mean = stall_sum / static_cast<double>(mode.checkpoints);
  mode.flush_ms_mean = flush_sum / static_cast<double>(mode.checkpoints);
  mode.stall_per_step = mode.step_ms > 0 ? mode.stall_ms_mean / mode.step_ms : 0;
  return mode;
}

nlohmann::json mode_json(const CheckpointModeResult& m) {
  return {{"lazy", m.lazy},
          {"pool_bytes", m.pool_bytes},
          {"checkpoints", m.checkpoints},
          {"step_ms", m.step_ms},
          {"stall_ms_mean", m.stall_ms_mean},
          {"stall_ms_max", m.stall_ms_max},
          {"flush_ms_mean", m.flush_ms_mean},
          {"stall_per_step", m.stall_per_step},
          {"flush_fits", m.flush_fits}};
}

}  // namespace

CheckpointBenchResult run_checkpoint_bench(const CheckpointBenchOptions& options) {
  TANDEM_CHECK(options.interval >= 1, "bench checkpoint: --interval must be at least 1");
  TANDEM_CHECK(options.steps > options.interval, "bench checkpoint: --steps (", options.steps,
               ") must exceed --interval (", options.interval, ")");
  CheckpointBenchResult result;
  result.params = options.config.model.num_parameters();
  result.steps = options.steps;
  result.interval = options.interval;
  const uint64_t state_bytes =
      static_cast<uint64_t>(options.config.model.num_parameters()) *
      optimizer_family(options.config.optimizer.type).state_bytes_per_param();
  const int64_t pool_mb = options.pool_mb > 0
                              ? options.pool_mb
                              : std::max<int64_t>(1, static_cast<int64_t>(state_bytes / 8 >> 20));
  TANDEM_CHECK(static_cast<uint64_t>(pool_mb) << 20 < state_bytes, "bench checkpoint: a pool of ",
               pool_mb, " MiB holds the whole state (", format_bytes(state_bytes),
               "), so nothing would stream; give a smaller --pool-mb or a larger model");
  result.sync = measure(options, "synchronous", false, 0, result);
  result.lazy = measure(options, "lazy", true, 0, result);
  result.streamed = measure(options, "streamed", true, pool_mb, result);
  return result;
}

nlohmann::json CheckpointBenchResult::to_json() const {
  return {{"params", params},
          {"checkpoint_bytes", checkpoint_bytes},
          {"steps", steps},
          {"interval", interval},
          {"synchronous", mode_json(sync)},
          {"lazy", mode_json(lazy)},
          {"streamed", mode_json(streamed)}};
}

std::string CheckpointBenchResult::to_text() const {
  std::string text =
      cat("checkpoint bench: ", params, " parameters, ", format_bytes(checkpoint_bytes),
          " per checkpoint; ", steps, " steps per mode, a checkpoint every ", interval,
          " (the last left out)\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %11s %12s %11s %11s %12s  %s\n", "mode", "step (ms)",
                "stall mean", "stall max", "flush (ms)", "stall / step", "flush fits");
  text += line;
  for (const CheckpointModeResult* m : {&sync, &lazy, &streamed}) {
    std::snprintf(line, sizeof line, "%-12s %11.2f %12.2f %11.2f %11.2f %12.4f  %s\n",
                  m->name.c_str(), m->step_ms, m->stall_ms_mean, m->stall_ms_max, m->flush_ms_mean,
                  m->stall_per_step, m->flush_fits ? "yes" : "no");
    text += line;
  }
  text +=
      cat("goal: a lazy checkpoint stalls at most 5% of a step where its flush fits: ",
          lazy.flush_fits ? (lazy.stall_per_step <= 0.05 ? "met" : "NOT met")
                          : "not applicable (the flush does not fit)",
          "\n", "streamed: lazy checkpoints through a pool of ", format_bytes(streamed.pool_bytes),
          " instead of a full copy; the update after a checkpoint waits for the disk where "
          "the pool is full\n");
  return text;
}

}  // namespace tandem
