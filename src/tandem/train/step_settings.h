// Where a run's "auto" settings become numbers (config/step_plan.h): before anything is
// allocated, the ranks plan the step on a device made for the purpose and freed again
// (plan_step_over_ranks), and every rank takes rank 0's choice, so that all ranks train with the
// same micro-batches. A run resumed from a checkpoint keeps the settings that run chose: the data
// order and the numbers depend on them.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>

#include "tandem/comm/communicator.h"
#include "tandem/config/step_plan.h"
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

// The step plan as a run's ranks make it, `config`'s "auto" settings planned for
// comm.world_size() ranks. On a cpu device every rank plans at once (they share this
// machine's cores while they train, and so they do while they measure), measuring their
// communication rate first (a collective); on a cuda device rank 0 plans alone, as each rank
// will have a GPU of its own (which one is known only once NCCL has placed them), and the
// buffers' rate is assumed (NVLink). Returns the plan on the ranks that made one; rank 0's
// is the one that decides.
std::optional<StepPlan> plan_step_over_ranks(const TrainConfig& config, Communicator& comm,
                                             const CpuDeviceOptions& injected = {});

// The plan a run of `world_size` ranks on this machine would make, the ranks played by
// threads of this process (ranks_planning_here of them, as plan_step_over_ranks's): what
// `tandem plan --world-size N` and `tandem bench plan` show is what such a run chooses.
StepPlan plan_step_on_local_ranks(const TrainConfig& config, int world_size);

// How many in-process ranks measure for a run of `world_size` planned on this machine: at
// most the CPUs this process may use (a run puts no more ranks on one machine's cores, and a
// plan for 64 ranks must not hold 64 ranks' calibration buffers), at least two of several
// (to measure their communication).
int ranks_planning_here(int world_size);

// The same for a process that is a world of its own (the bench commands).
TrainConfig with_chosen_step_settings(const TrainConfig& config, std::FILE* log = stderr);

}  // namespace tandem
