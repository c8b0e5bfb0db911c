#include <string>

#include "tandem/cli/commands.h"
#include "tandem/config/train_config.h"

namespace tandem::cli {

TrainConfig ConfigOptions::load() const { return load_train_config(path, overrides); }

void add_config_options(CLI::App* cmd, ConfigOptions& options, const std::string& set_help) {
  cmd->add_option("--config", options.path, "Run configuration (JSON)")->required();
  cmd->add_option("--set", options.overrides, set_help);
}

}  // namespace tandem::cli
