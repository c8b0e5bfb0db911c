#include "tandem/train/run_report.h"

#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/format.h"

namespace tandem {

RunReport::RunReport(std::filesystem::path metrics_path, int64_t total_steps, int64_t log_interval,
                     bool show_progress)
    : metrics_path_(std::move(metrics_path)), progress_(total_steps, log_interval, show_progress) {}

void RunReport::start(int64_t step, const std::filesystem::path& resumed,
                      const nlohmann::json& plan) {
  metrics_.emplace(metrics_path_, resumed.empty() ? std::nullopt : std::optional<int64_t>(step));
  if (!resumed.empty()) metrics_->write({{"step", step}, {"resumed_from", resumed.string()}});
  metrics_->write({{"step", step}, {"plan", plan}});
}

void RunReport::skipped(int64_t step, const StepRecord& figures, int64_t in_a_row) {
  metrics_->write({{"step", step},
                   {"skipped", true},
                   {"loss", figures.loss},
                   {"grad_norm", figures.grad_norm},
                   {"skipped_in_a_row", in_a_row}});
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
