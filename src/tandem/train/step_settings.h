// Where a run's "auto" settings become numbers (config/step_plan.h): before anything is
// allocated, rank 0 plans the step on a device made for the purpose and freed again, and
// every rank takes its choice, so that all ranks train with the same micro-batches. A run
// resumed from a checkpoint keeps the settings that run chose: the data order and the
// numbers depend on them.
#pragma once

#include <cstdio>
#include <filesystem>

#include "tandem/comm/communicator.h"
#include "tandem/config/train_config.h"
#include "tandem/device/device.h"

namespace tandem {

// `config` with its "auto" settings chosen (unchanged when none is): the checkpoint's at
// `resume` (when set and readable), else rank 0's plan, printed to `log` (null: silent).
// Every rank calls it.
TrainConfig with_chosen_step_settings(const TrainConfig& config, Communicator& comm,
                                      const std::filesystem::path& resume = {},
                                      std::FILE* log = stderr,
                                      const CpuDeviceOptions& injected = {});

// The same for a process that is a world of its own (the bench commands).
TrainConfig with_chosen_step_settings(const TrainConfig& config, std::FILE* log = stderr);

}  // namespace tandem
