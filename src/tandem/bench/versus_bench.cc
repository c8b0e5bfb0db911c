#include "tandem/bench/versus_bench.h"

#include <algorithm>
#include <cstdio>

#include "tandem/ckpt/resume_check.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"
#include "tandem/train/trainer.h"

namespace tandem {

namespace {

StepMedians median_of(const std::vector<StepMedians>& runs) {
  auto of = [&](double StepMedians::*field) {
    std::vector<double> values;
    for (const StepMedians& m : runs) values.push_back(m.*field);
    return median(values);
  };
  return {.tokens_per_s = of(&StepMedians::tokens_per_s),
          .ms = of(&StepMedians::ms),
          .forward_ms = of(&StepMedians::forward_ms),
          .backward_ms = of(&StepMedians::backward_ms),
          .update_ms = of(&StepMedians::update_ms),
          .update_exposed_ms = of(&StepMedians::update_exposed_ms)};
}

}  // namespace

VersusBenchResult run_versus_bench(const VersusBenchOptions& options) {
  TANDEM_CHECK(options.rounds >= 1 && options.steps >= 1 && options.warmup >= 0,
               "tandem bench versus: --rounds and --steps must be at least 1, --warmup at least 0");
  VersusBenchResult result;
  result.changes = options.changes;
  result.params = options.base.model.num_parameters();
  result.batch = options.base.micro_batch_size;
  result.seq_len = options.base.seq_len();
  result.rounds = options.rounds;
  result.timed_steps = options.steps;
  result.device = device_kind_name(options.base.device.type);
  std::vector<StepMedians> runs[2];
  std::vector<std::string> digests;
  VersusSide* sides[2] = {&result.base, &result.variant};
  const TrainConfig* configs[2] = {&options.base, &options.variant};
  for (int round = 0; round < options.rounds; round++) {
    // Alternating which side goes first cancels a machine that speeds up or slows down.
    for (int k = 0; k < 2; k++) {
      const int side = (round + k) % 2;
      if (options.progress)
        options.progress(cat("round ", round + 1, " of ", options.rounds, ": the ",
                             side == 0 ? "base" : "variant"));
      const TrainResult run = train_for_bench(*configs[side], options.warmup, options.steps);
      runs[side].push_back(step_medians(run, options.warmup));
      digests.push_back(run.state_digest);
      sides[side]->state_digest = run.state_digest;
      sides[side]->device_bytes_in_use = run.device_bytes_in_use;
      sides[side]->planned_activation_bytes = run.plan.activation_bytes;
    }
  }
  for (int side = 0; side < 2; side++) sides[side]->medians = median_of(runs[side]);
  result.digests_agree = std::all_of(digests.begin(), digests.end(),
                                     [&](const std::string& d) { return d == digests.front(); });
  TrainingState base_run;
  base_run.config = options.base;
  base_run.world_size = 1;
  for (const ResumeMismatch& m :
       resume_mismatches(base_run, options.variant,
                         RunData{.train_tokens_xxh3 = {}, .train_tokens = 0, .world_size = 1}))
    result.number_changes.push_back(m.key);
  return result;
}

double VersusBenchResult::ms_ratio() const {
  return base.medians.ms > 0 ? variant.medians.ms / base.medians.ms : 0.0;
}

double VersusBenchResult::tokens_per_s_ratio() const {
  return base.medians.tokens_per_s > 0 ? variant.medians.tokens_per_s / base.medians.tokens_per_s
                                       : 0.0;
}

std::string VersusBenchResult::to_text() const {
  std::string changed;
  for (const std::string& c : changes) changed += (changed.empty() ? "" : ", ") + c;
  std::string text =
      cat("tandem bench versus: ", params, " parameters, ", batch, " x ", seq_len, " tokens, ",
          device, " device; ", rounds, " rounds of ", timed_steps, " timed steps a side\n");
  text += "            tokens/s    ms/step  forward  backward   update (exposed)  device memory\n";
  auto row = [&](const char* name, const VersusSide& s) {
    char line[160];
    std::snprintf(line, sizeof line, "%-10s %9.0f %10.1f %8.1f %9.1f %8.1f %8.1f   %s\n", name,
                  s.medians.tokens_per_s, s.medians.ms, s.medians.forward_ms, s.medians.backward_ms,
                  s.medians.update_ms, s.medians.update_exposed_ms,
                  format_bytes(s.device_bytes_in_use).c_str());
    text += line;
  };
  row("base", base);
  row("variant", variant);
  text += cat("variant (", changed, ") / base: ", format_fixed(ms_ratio(), 3),
              "x the time per step, ", format_fixed(tokens_per_s_ratio(), 3), "x the tokens/s\n");
  std::string changed_numbers;
  for (const std::string& key : number_changes)
    changed_numbers += cat(changed_numbers.empty() ? "" : ", ", key);
  if (digests_agree)
    text += cat("state digests: the same for both (", base.state_digest, ")\n");
  else if (!number_changes.empty())
    text +=
        cat("state digests: differ, as expected: the variant changes what the numbers "
            "depend on (",
            changed_numbers, ")\n");
  else
    text +=
        "state digests: DIFFER between the sides (a bug: these settings must not change a "
        "number)\n";
  return text;
}

nlohmann::json VersusBenchResult::to_json() const {
  auto side = [](const VersusSide& s) {
    return nlohmann::json{{"tokens_per_s", s.medians.tokens_per_s},
                          {"ms", s.medians.ms},
                          {"forward_ms", s.medians.forward_ms},
                          {"backward_ms", s.medians.backward_ms},
                          {"update_ms", s.medians.update_ms},
                          {"update_exposed_ms", s.medians.update_exposed_ms},
                          {"device_bytes_in_use", s.device_bytes_in_use},
                          {"planned_activation_bytes", s.planned_activation_bytes},
                          {"state_digest", s.state_digest}};
  };
  return {{"changes", changes},
          {"base", side(base)},
          {"variant", side(variant)},
          {"ms_ratio", ms_ratio()},
          {"tokens_per_s_ratio", tokens_per_s_ratio()},
          {"digests_agree", digests_agree},
          {"number_changes", number_changes},
          {"params", params},
          {"batch", batch},
          {"seq_len", seq_len},
          {"rounds", rounds},
          {"timed_steps", timed_steps},
          {"device", device}};
}

}  // namespace tandem
