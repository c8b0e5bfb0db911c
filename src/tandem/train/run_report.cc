#include "tandem/train/run_report.h"

#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/model/model_family.h"

namespace tandem {

RunReport::RunReport(std::filesystem::path metrics_path, int64_t total_steps, int64_t log_interval,
                     bool show_progress)
    : metrics_path_(std::move(metrics_path)), progress_(total_steps, log_interval, show_progress) {}

void RunReport::note_plan(const TrainingMemoryPlan& plan, std::string_view device_name) {
  std::string text = plan.to_text();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  std::string indented = cat("tandem: optimizer update plan on the ", device_name, " device:\n  ");
  for (char c : text) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
  progress_.note(indented);
}

void RunReport::announce(const TrainConfig& config, size_t tokens, uint64_t batches_per_epoch,
                         int world_size, std::string_view backend) {
  const int B = config.micro_batch_size, T = config.seq_len();
  const int accum = config.gradient_accumulation_steps;
  progress_.note(cat("tandem: training ", model_family(config.model.type).hf_architecture, " (",
                     config.model.n_layer, " layers, ", config.model.n_embd, " channels, ",
                     config.model.num_parameters(), " parameters",
                     config.train.init_from.empty() ? "" : cat(", from ", config.train.init_from),
                     ") with ", optimizer_type_name(config.optimizer.type), " on ", tokens,
                     " tokens (", batches_per_epoch, " batches of ", B, "x", T, " per epoch), ",
                     config.train.steps, " steps"));
  if (world_size > 1)
    progress_.note(cat("tandem: ", world_size, " ranks (", backend, "), ZeRO stage ",
                       config.zero.stage, ", global batch ", B * accum * world_size, " sequences (",
                       B, " x ", accum, " micro-batches x ", world_size, " ranks)"));
}

void RunReport::start(int64_t step, const std::filesystem::path& resumed,
                      const TrainingMemoryPlan& plan) {
  metrics_.emplace(metrics_path_, resumed.empty() ? std::nullopt : std::optional<int64_t>(step));
  if (!resumed.empty()) metrics_->write({{"step", step}, {"resumed_from", resumed.string()}});
  metrics_->write(
      {{"step", step},
       {"plan",
        {{"world_size", plan.world_size},
         {"zero_stage", plan.zero_stage},
         {"schedule", std::string(update_schedule_name(plan.offload.settings.schedule))},
         {"partition_params", plan.offload.partition.size()},
         {"model_state_bytes", plan.model_state_bytes()},
         {"zero_buffer_bytes", plan.zero_buffer_bytes},
         {"device_bytes", plan.total.device},
         {"pinned_host_bytes", plan.total.pinned_host},
         {"host_bytes", plan.total.host}}}});
}

void RunReport::skipped(int64_t step, const StepRecord& figures, int64_t in_a_row) {
  metrics_->write({{"step", step},
                   {"skipped", true},
                   {"loss", figures.loss},
                   {"grad_norm", figures.grad_norm},
                   {"skipped_in_a_row", in_a_row}});
  if (figures.counted_targets == 0)
    progress_.note(cat("step ", step,
                       ": skipped: the loss mask counts none of its targets (every token of its "
                       "batches is prompt), ",
                       in_a_row, " in a row"));
  else
    progress_.note(cat("step ", step, ": skipped (loss ", figures.loss, ", gradient norm ",
                       figures.grad_norm, "), ", in_a_row, " in a row"));
}

void RunReport::step(const StepRecord& record, const nlohmann::json& line) {
  metrics_->write(line);
  progress_.update(record.step, record.loss, record.tokens_per_s, record.ms);
}

void RunReport::val_loss(int64_t step, float loss) {
  metrics_->write({{"step", step}, {"val_loss", loss}});
  progress_.note(cat("step ", step, ": val_loss ", loss));
}

void RunReport::checkpoint(const CheckpointRecord& record) {
  if (!record.error.empty()) {
    progress_.note(cat("tandem: ", record.error, "; training goes on"));
    metrics_->write({{"step", record.step}, {"checkpoint_error", record.error}});
    return;
  }
  if (record.path.empty()) return;
  progress_.note(cat("step ", record.step, ": saved ", record.path.string(), " (",
                     record.lazy ? "lazy" : "synchronous", ": training waited ",
                     format_fixed(record.stall_ms, 1), " ms, written in ",
                     format_fixed(record.flush_ms, 1), " ms)"));
  metrics_->write({{"step", record.step},
                   {"checkpoint", record.path.string()},
                   {"checkpoint_lazy", record.lazy},
                   {"checkpoint_stall_ms", record.stall_ms},
                   {"checkpoint_flush_ms", record.flush_ms}});
}

void RunReport::finish(int64_t step, const nlohmann::json& summary) {
  nlohmann::json record = summary;
  record["step"] = step;
  metrics_->write(record);
}

}  // namespace tandem
