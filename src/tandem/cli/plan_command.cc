#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/step_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/train/step_settings.h"

namespace tandem::cli {
namespace {

// The optimizer's word on how its settings apply to the model (DeMo's clamped top-k), a line.
void print_settings_note(const TrainConfig& config) {
  const std::string note =
      optimizer_family(config.optimizer.type).note_on(config.optimizer, model_layout(config.model));
  if (!note.empty()) std::printf("%s\n", note.c_str());
}

// Rank `rank`'s plan as a run of `world_size` ranks on the cpu device would make it: its ranks
// at once (ranks_planning_here of them, threads of this process, each planning `rank`'s
// part), sharing this machine's cores as they would while they train, so that the update rates
// it predicts with are theirs.
TrainingMemoryPlan plan_on_local_ranks(const TrainConfig& config, int world_size, int rank) {
  TrainingMemoryPlan plan;
  run_local_ranks(ranks_planning_here(world_size), [&](Communicator& comm) {
    ThreadPool pool;
    TrainingMemoryPlan mine =
        plan_training(config, *make_training_device(config), pool,
                      zero_state_range(config, world_size, rank), world_size, &comm);
    if (comm.rank() == 0) plan = std::move(mine);
  });
  return plan;
}

}  // namespace

void register_plan(CLI::App& app) {
  struct Args {
    ConfigOptions config;
    int world_size = 1;
    int rank = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Print, without training, the memory each tier needs, the optimizer update schedule and "
      "its predicted update time; with \"auto\" settings, the micro-batch, accumulation and "
      "recompute chosen, the runners-up and each one's predicted step");
  add_config_options(cmd, args->config);
  cmd->add_option(
         "--world-size", args->world_size,
         "Plan one rank of a data-parallel run over this many ranks "
         "(zero_optimization.stage decides what each rank holds; on the cpu device, "
         "that many in-process ranks (at most this machine's CPUs) measure together, as the "
         "run's would)")
      ->check(positive_number());
  cmd->add_option("--rank", args->rank, "The rank to plan (default 0, which holds the most)")
      ->check(non_negative_number());
  cmd->callback([args] {
    const TrainConfig config = args->config.load();
    TANDEM_CHECK(args->rank < args->world_size, "--rank ", args->rank,
                 " is not a rank of --world-size ", args->world_size, "; use 0 to ",
                 args->world_size - 1);
    ThreadPool pool;
    const ParamRange state_range = zero_state_range(config, args->world_size, args->rank);
    std::string who;
    if (args->world_size > 1) who = cat(", rank ", args->rank, " of ", args->world_size);
    // A plan for a GPU machine made where there is none: the GPU is modelled (its rates
    // assumed, and said so), not refused.
    std::string why_no_gpu;
    const bool modelled =
        config.device.type == DeviceKind::kCuda && cuda_device_count(&why_no_gpu) == 0;
    const std::string on = modelled
                               ? cat("a cuda device of ", config.device.memory_gb, " GiB", who,
                                     " (modelled: ", why_no_gpu, ")")
                               : cat("the ", device_kind_name(config.device.type), " device", who);
    // "auto" settings: the step planner's choice and its runners-up, then the chosen plan.
    if (config.has_auto_step_settings()) {
      TANDEM_CHECK(args->rank == 0,
                   "--rank is for fixed settings: with \"auto\" ones rank 0 "
                   "plans for every rank; leave --rank out");
      // As the run's ranks would plan it: on a cpu device, all of them at once.
      const StepPlan step = modelled ? plan_step_without_gpu(config, pool, args->world_size)
                                     : plan_step_on_local_ranks(config, args->world_size);
      const TrainConfig chosen =
          with_step_settings(config, step.chosen().settings, args->world_size);
      std::printf("tandem plan for %s on %s\n%s%s%s\n", args->config.path.c_str(), on.c_str(),
                  step.to_text().c_str(), step.chosen().memory.to_text().c_str(),
                  largest_micro_batch_text(step.chosen().memory, chosen).c_str());
      print_settings_note(chosen);
      return;
    }
    if (config.train_batch_size > 0) step_candidates(config, args->world_size);  // the product
    const bool cpu_ranks = config.device.type != DeviceKind::kCuda && args->world_size > 1;
    const TrainingMemoryPlan plan =
        modelled    ? plan_training_without_gpu(config, pool, state_range, args->world_size)
        : cpu_ranks ? plan_on_local_ranks(config, args->world_size, args->rank)
                    : plan_training(config, *make_training_device(config), pool, state_range,
                                    args->world_size);
    std::printf("tandem plan for %s on %s\n%s%s\n", args->config.path.c_str(), on.c_str(),
                plan.to_text().c_str(), largest_micro_batch_text(plan, config).c_str());
    print_settings_note(config);
    check_fits(plan, config);
  });
}

}  // namespace tandem::cli
