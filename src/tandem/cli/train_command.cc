#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/train/train_config.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {

void register_train(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string metrics;
    std::string resume;
    int64_t stop_at_step = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a JSON run configuration");
  cmd->add_option("--config", args->config, "Run configuration (JSON)")->required();
  cmd->add_option("--set", args->overrides,
                  "Override a config value, e.g. --set optimizer.params.lr=3e-4 (repeatable)");
  cmd->add_option("--metrics", args->metrics,
                  "Append one JSON object per step and per evaluation to this file");
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint (a checkpoint dir, a checkpoints dir or a run dir)");
  cmd->add_option("--stop-at-step", args->stop_at_step,
                  "Stop (with a checkpoint) after this many steps; the schedule still spans "
                  "train.steps");
  cmd->callback([args] {
    const TrainConfig config = load_train_config(args->config, args->overrides);
    TrainOptions options;
    options.resume = args->resume;
    options.metrics_path = args->metrics;
    options.stop_at_step = args->stop_at_step;
    const TrainResult result = train(config, options);
    std::fprintf(stderr, "tandem: %ld steps, train loss %.4f", static_cast<long>(result.steps_done),
                 result.last_train_loss);
    if (!std::isnan(result.last_val_loss))
      std::fprintf(stderr, ", val loss %.4f", result.last_val_loss);
    std::fprintf(stderr, "; checkpoint %s\n", result.last_checkpoint.c_str());
    if (!result.sample.empty()) {
      std::fprintf(stderr, "tandem: a sample from the model:\n");
      std::fwrite(result.sample.data(), 1, result.sample.size(), stdout);
      std::fputc('\n', stdout);
    }
  });
}

}  // namespace tandem::cli
