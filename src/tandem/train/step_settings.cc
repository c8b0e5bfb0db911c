#include "tandem/train/step_settings.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/comm_rate.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/step_plan.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {

namespace {

nlohmann::json settings_json(const StepSettings& s) {
  return {s.micro_batch, s.accumulation, s.recompute_interval, s.cpu_checkpointing};
}

StepSettings settings_of(const nlohmann::json& j) {
  return {j.at(0).get<int>(), j.at(1).get<int>(), j.at(2).get<int>(), j.at(3).get<bool>()};
}

// The settings the checkpoint's run trained with, when `resume` names one whose config reads.
std::optional<StepSettings> resumed_settings(const TrainConfig& now,
                                             const std::filesystem::path& resume, int world_size) {
  if (resume.empty()) return std::nullopt;
  try {
    const TrainingState then = read_training_state(resolve_checkpoint(resume));
    // The same micro-batches per step over this run's ranks (resume_check.h), when they
    // divide and make the sequences per step asked for now.
    const int64_t micro_batches =
        int64_t{then.config.gradient_accumulation_steps} * std::max(1, then.world_size);
    if (micro_batches % world_size != 0 ||
        (now.train_batch_size > 0 &&
         micro_batches * then.config.micro_batch_size != now.train_batch_size))
      return std::nullopt;  // planned afresh; the resume's checks name what differs
    return StepSettings{then.config.micro_batch_size, static_cast<int>(micro_batches / world_size),
                        then.config.activation_checkpointing.interval,
                        then.config.activation_checkpointing.cpu_checkpointing};
  } catch (const Error&) {
    return std::nullopt;  // the resume itself says what is wrong with it
  }
}

// plan_step_over_ranks for a run of `world_size` ranks, `comm`'s measuring (all of the run's, or
// those of them that play it on this machine).
std::optional<StepPlan> plan_step_for(const TrainConfig& config, Communicator& comm, int world_size,
                                      const CpuDeviceOptions& injected) {
  const bool cpu = config.device.type != DeviceKind::kCuda;
  if (!cpu && comm.rank() != 0) return std::nullopt;
  // The ranks that will share this machine's cores, measuring together.
  Communicator* peers = comm.world_size() > 1 && cpu ? &comm : nullptr;
  const CommRate rate = peers != nullptr ? measure_comm_rate(*peers) : CommRate{};
  ThreadPool pool;
  const std::unique_ptr<Device> device = make_training_device(config, 0, injected);
  return plan_step(config, *device, pool, world_size, rate, peers);
}

}  // namespace

std::optional<StepPlan> plan_step_over_ranks(const TrainConfig& config, Communicator& comm,
                                             const CpuDeviceOptions& injected) {
  return plan_step_for(config, comm, comm.world_size(), injected);
}

StepPlan plan_step_on_local_ranks(const TrainConfig& config, int world_size) {
  StepPlan plan;
  run_local_ranks(ranks_planning_here(world_size), [&](Communicator& comm) {
    std::optional<StepPlan> mine = plan_step_for(config, comm, world_size, {});
    if (comm.rank() == 0) plan = std::move(*mine);
  });
  return plan;
}

int ranks_planning_here(int world_size) {
  if (world_size <= 1) return 1;
  const int cpus = static_cast<int>(allowed_cpus().size());
  return std::min(world_size, std::max(2, cpus));
}

TrainConfig with_chosen_step_settings(const TrainConfig& config, Communicator& comm,
                                      const std::filesystem::path& resume, std::FILE* log,
                                      const CpuDeviceOptions& injected) {
  const int world_size = comm.world_size();
  if (!config.has_auto_step_settings()) {
    if (config.train_batch_size > 0) step_candidates(config, world_size);  // checks the product
    return config;
  }
  std::string chosen, error;
  try {
    // Whether train_batch_size splits over the ranks: every rank can say, and says it alike.
    step_candidates(config, world_size);
  } catch (const Error& e) {
    error = e.what();
  }
  // A resumed run keeps its checkpoint's settings where they still make the batch: rank 0
  // reads them and tells the others.
  if (comm.rank() == 0 && error.empty()) {
    if (const std::optional<StepSettings> then = resumed_settings(config, resume, world_size)) {
      chosen = settings_json(*then).dump();
      if (log != nullptr)
        std::fprintf(log, "tandem: \"auto\" settings as the resumed run chose them: %s\n",
                     then->to_text().c_str());
    }
  }
  if (error.empty()) chosen = broadcast_string(comm, chosen, 0);
  // Otherwise the planner chooses, rank 0's plan deciding.
  if (error.empty() && chosen.empty()) {
    try {
      const std::optional<StepPlan> plan = plan_step_over_ranks(config, comm, injected);
      if (comm.rank() == 0) {
        chosen = settings_json(plan->chosen().settings).dump();
        if (log != nullptr) std::fprintf(log, "tandem: %s", plan->to_text().c_str());
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  fail_together(comm, error, "a rank could not choose the \"auto\" settings (its error says why)");
  chosen = broadcast_string(comm, chosen, 0);
  return with_step_settings(config, settings_of(nlohmann::json::parse(chosen)), world_size);
}

TrainConfig with_chosen_step_settings(const TrainConfig& config, std::FILE* log) {
  if (!config.has_auto_step_settings() && config.train_batch_size == 0) return config;
  LocalGroup single(1);
  return with_chosen_step_settings(config, *single.communicator(0), {}, log);
}

}  // namespace tandem
