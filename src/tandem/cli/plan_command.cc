#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/train/memory_plan.h"
#include "tandem/train/train_config.h"

namespace tandem::cli {

void register_plan(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Print, without training, the memory each tier needs, the optimizer update schedule and "
      "its predicted update time");
  cmd->add_option("--config", args->config, "Run configuration (JSON)")->required();
  cmd->add_option("--set", args->overrides, "Override a config value (repeatable)");
  cmd->callback([args] {
    const TrainConfig config = load_train_config(args->config, args->overrides);
    auto device = make_training_device(config);
    ThreadPool pool;
    const TrainingMemoryPlan plan = plan_training(config, *device, pool);
    std::printf("tandem plan for %s on the %s device\n%s", args->config.c_str(),
                std::string(device->name()).c_str(), plan.to_text().c_str());
    check_fits(plan, config);
  });
}

}  // namespace tandem::cli
