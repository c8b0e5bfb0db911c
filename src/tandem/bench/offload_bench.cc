#include "tandem/bench/offload_bench.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "tandem/comm/local_group.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"
#include "tandem/train/step_settings.h"

namespace tandem {

StepMedians step_medians(const TrainResult& result, int warmup) {
  const std::vector<StepRecord>& steps = result.steps;
  auto median_of_field = [&](double StepRecord::*field) {
    std::vector<double> values;
    for (size_t i = static_cast<size_t>(warmup); i < steps.size(); i++)
      values.push_back(steps[i].*field);
    return median(values);
  };
  // An update's time in its step and in the next one: the steps that have a next one.
  const size_t last =
      steps.size() > static_cast<size_t>(warmup) + 1 ? steps.size() - 1 : steps.size();
  std::vector<double> whole, exposed;
  for (size_t i = static_cast<size_t>(warmup); i < last; i++) {
    const double later_waited = i + 1 < steps.size() ? steps[i + 1].update_wait_ms : 0.0;
    const double later_hidden = i + 1 < steps.size() ? steps[i + 1].update_hidden_ms : 0.0;
    whole.push_back(steps[i].update.ms + later_waited + later_hidden);
    exposed.push_back(steps[i].update.ms + later_waited);
  }
  return {.tokens_per_s = median_of_field(&StepRecord::tokens_per_s),
          .ms = median_of_field(&StepRecord::ms),
          .forward_ms = median_of_field(&StepRecord::forward_ms),
          .backward_ms = median_of_field(&StepRecord::backward_ms),
          .update_ms = median(whole),
          .update_exposed_ms = median(exposed)};
}

TrainResult train_for_bench(TrainConfig config, int warmup, int steps, int world_size) {
  config.train.steps = warmup + steps;
  config.train.eval_interval = 0;
  config.train.sample_bytes = 0;
  TrainOptions quiet;
  quiet.save_checkpoints = false;
  quiet.show_progress = false;
  if (world_size == 1) return train(config, quiet);
  TrainResult first;
  run_local_ranks(world_size, [&](Communicator& comm) {
    TrainResult mine = train(config, quiet, comm);
    if (comm.rank() == 0) first = std::move(mine);
  });
  return first;
}

OffloadBenchResult run_offload_bench(const OffloadBenchOptions& options) {
  OffloadBenchResult result;
  result.params = options.config.model.num_parameters();
  result.batch = options.config.micro_batch_size;
  result.seq_len = options.config.seq_len();
  result.timed_steps = options.steps;
  result.device = device_kind_name(options.config.device.type);
  for (size_t i = 0; i < options.schedules.size(); i++) {
    const UpdateSchedule schedule = options.schedules[i];
    if (options.progress)
      options.progress(cat("schedule ", update_schedule_name(schedule), " (", i + 1, " of ",
                           options.schedules.size(), ")"));
    TrainConfig config = options.config;
    config.offload.schedule = schedule;
    OffloadBenchCase c;
    c.schedule = schedule;
    try {
      config = with_chosen_step_settings(config, options.progress ? stderr : nullptr);
      c.settings = {config.micro_batch_size, config.gradient_accumulation_steps,
                    config.activation_checkpointing.interval,
                    config.activation_checkpointing.cpu_checkpointing};
      const TrainResult run = train_for_bench(config, options.warmup, options.steps);
      c.medians = step_medians(run, options.warmup);
      c.plan = run.plan;
      c.predicted_update_ms = run.plan.prediction.seconds * 1e3;
      c.predicted_exposed_update_ms = c.predicted_update_ms;
      if (config.offload.overlap_forward) {
        std::vector<double> forward;  // its own work: less its waits for the last update
        for (size_t s = static_cast<size_t>(options.warmup); s < run.steps.size(); s++)
          forward.push_back(run.steps[s].forward_ms - run.steps[s].update_wait_ms);
        const double forward_s = median(forward) / 1e3;
        c.predicted_exposed_update_ms -=
            predict_hidden_update(run.plan.offload, run.plan.prediction, forward_s) * 1e3;
      }
      c.device_bytes_in_use = run.device_bytes_in_use;
      c.state_digest = run.state_digest;
      for (const StepRecord& r : run.steps) c.losses.push_back(r.loss);
    } catch (const DeviceOutOfMemory& e) {
      // Its plan does not fit (check_fits): the other schedules are still worth measuring.
      c.error = e.what();
    }
    result.cases.push_back(std::move(c));
  }
  return result;
}

size_t OffloadBenchResult::schedules_run() const {
  return static_cast<size_t>(std::count_if(
      cases.begin(), cases.end(), [](const OffloadBenchCase& c) { return c.error.empty(); }));
}

bool OffloadBenchResult::digests_agree() const {
  const std::string* first = nullptr;
  for (const OffloadBenchCase& c : cases) {
    if (!c.error.empty()) continue;
    if (first == nullptr) first = &c.state_digest;
    if (c.state_digest != *first) return false;
  }
  return true;
}

double OffloadBenchResult::auto_to_best_fixed_update() const {
  double automatic = 0, best_fixed = std::numeric_limits<double>::infinity();
  for (const OffloadBenchCase& c : cases) {
    if (!c.error.empty()) continue;
    if (c.schedule == UpdateSchedule::kAuto)
      automatic = c.medians.update_ms;
    else
      best_fixed = std::min(best_fixed, c.medians.update_ms);
  }
  return automatic > 0 && best_fixed < std::numeric_limits<double>::infinity()
             ? automatic / best_fixed
             : 0;
}

namespace {

// "6 host, 1 resident, 6 staged, stride 2, 2 buffers"
std::string sites_text(const OffloadPlan& plan) {
  std::string text;
  for (UpdateSite site :
       {UpdateSite::kHost, UpdateSite::kDeviceResident, UpdateSite::kDeviceStaged}) {
    if (plan.count(site) == 0) continue;
    text += cat(text.empty() ? "" : ", ", plan.count(site), " ", update_site_name(site));
  }
  if (plan.count(UpdateSite::kDeviceStaged) > 0)
    text += cat(", stride ", plan.settings.stride, ", ", plan.settings.staging_buffers, " buffers");
  return text;
}

}  // namespace

std::string OffloadBenchResult::to_text() const {
  std::string text =
      cat("tandem bench offload: ", params, " parameters, ", batch, " x ", seq_len, " tokens, ",
          device, " device; medians of ", timed_steps, " steps\n",
          "schedule    tokens/s  ms/step   fwd ms   bwd ms  update ms  predicted  pred/meas  "
          "exposed ms  predicted  device      pinned host  state digest      plan\n");
  for (const OffloadBenchCase& c : cases) {
    const std::string name(update_schedule_name(c.schedule));
    if (!c.error.empty()) {
      text += cat(name, ": not run: ", c.error, "\n");
      continue;
    }
    const StepMedians& m = c.medians;
    char row[512];
    std::snprintf(row, sizeof row,
                  "%-10s  %8.0f  %7.1f  %7.1f  %7.1f  %9.2f  %9.2f  %9.3f  %10.2f  %9.2f  %-10s  "
                  "%-11s  %-16s  ",
                  name.c_str(), m.tokens_per_s, m.ms, m.forward_ms, m.backward_ms, m.update_ms,
                  c.predicted_update_ms, m.update_ms > 0 ? c.predicted_update_ms / m.update_ms : 0,
                  m.update_exposed_ms, c.predicted_exposed_update_ms,
                  format_bytes(c.plan.total.device).c_str(),
                  format_bytes(c.plan.total.pinned_host).c_str(), c.state_digest.c_str());
    text += row + sites_text(c.plan.offload) + "; " + c.settings.to_text() + "\n";
  }
  if (schedules_run() > 1)
    text += digests_agree() ? "state digests: the same for every schedule\n"
                            : "state digests: DIFFER between schedules (a bug: every schedule "
                              "must compute the same bits)\n";
  if (const double r = auto_to_best_fixed_update(); r > 0)
    text += cat("auto's update time / the fastest fixed schedule's: ", format_fixed(r, 3), "\n");
  return text;
}

nlohmann::json OffloadBenchResult::to_json() const {
  nlohmann::json runs = nlohmann::json::array();
  for (const OffloadBenchCase& c : cases) {
    nlohmann::json run = {{"schedule", std::string(update_schedule_name(c.schedule))}};
    if (!c.error.empty()) {
      run["error"] = c.error;
      runs.push_back(run);
      continue;
    }
    const StepMedians& m = c.medians;
    const OffloadPlan& plan = c.plan.offload;
    run.update(
        {{"tokens_per_s", m.tokens_per_s},
         {"ms", m.ms},
         {"forward_ms", m.forward_ms},
         {"backward_ms", m.backward_ms},
         {"update_ms", m.update_ms},
         {"predicted_update_ms", c.predicted_update_ms},
         {"predicted_to_measured", m.update_ms > 0 ? c.predicted_update_ms / m.update_ms : 0.0},
         {"update_exposed_ms", m.update_exposed_ms},
         {"predicted_exposed_update_ms", c.predicted_exposed_update_ms},
         {"micro_batch", c.settings.micro_batch},
         {"gradient_accumulation_steps", c.settings.accumulation},
         {"recompute_interval", c.settings.recompute_interval},
         {"cpu_checkpointing", c.settings.cpu_checkpointing},
         {"tokens_per_step", int64_t{c.settings.micro_batch} * c.settings.accumulation * seq_len},
         {"host_subgroups", plan.count(UpdateSite::kHost)},
         {"resident_subgroups", plan.count(UpdateSite::kDeviceResident)},
         {"staged_subgroups", plan.count(UpdateSite::kDeviceStaged)},
         {"stride", plan.settings.stride},
         {"staging_buffers", plan.settings.staging_buffers},
         {"device_bytes", c.plan.total.device},
         {"pinned_host_bytes", c.plan.total.pinned_host},
         {"host_bytes", c.plan.total.host},
         {"device_bytes_in_use", c.device_bytes_in_use},
         {"rates", c.plan.rates.to_text()},
         {"state_digest", c.state_digest},
         {"losses", c.losses}});
    runs.push_back(run);
  }
  return {{"params", params},
          {"batch", batch},
          {"seq_len", seq_len},
          {"device", device},
          {"timed_steps", timed_steps},
          {"digests_agree", digests_agree()},
          {"auto_to_best_fixed_update", auto_to_best_fixed_update()},
          {"runs", runs}};
}

}  // namespace tandem
